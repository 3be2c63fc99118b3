// kiln — shapes: any rank, dimensions are int64.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string str(const Shape& s);  // "(4,3)", "()" for rank 0
// Row-major element strides of a contiguous array of shape s.
std::vector<int64_t> contiguous_strides(const Shape& s);
// NumPy broadcasting of two shapes; throws "[op] cannot broadcast (a) and (b)".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Maps a possibly negative axis into [0, rank); throws naming op on overflow.
int normalize_axis(int64_t axis, size_t rank, const char* op);

}  // namespace kiln
