// safetensors: round trips, transformers' files, and every malformed case.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "kiln/io.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir()
      : path_(fs::temp_directory_path() /
              ("kiln-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file with the given JSON header and `data` bytes after it.
std::string file_bytes(const std::string& header, const std::string& data, int64_t claimed = -1) {
  uint64_t n = claimed >= 0 ? static_cast<uint64_t>(claimed) : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string load_error(const std::string& path) {
  try {
    io::load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  Params t{{"a", Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
           {"b", Array::from_vector<double>({-1.5}, {})},
           {"c", astype(Array::from_vector<float>({0.5f, 2}, {2}), DType::bf16)},
           {"d", Array::from_vector<int32_t>({7, -8}, {2})},
           {"e", Array::from_vector<int64_t>({1ll << 40}, {1})},
           {"f", Array::from_vector<bool>({true, false, true}, {3})},
           {"empty", zeros({0, 4})}};
  io::save_safetensors(dir.file("t.safetensors"), t, {{"format", "pt"}});
  auto back = io::load_safetensors(dir.file("t.safetensors"));
  EXPECT_EQ(back.metadata.at("format"), "pt");
  ASSERT_EQ(back.tensors.size(), t.size());
  for (auto& [name, a] : t) {
    const Array& b = back.tensors.at(name);
    EXPECT_EQ(b.dtype(), a.dtype()) << name;
    EXPECT_EQ(b.shape(), a.shape()) << name;
    EXPECT_EQ(b.to_vector<double>(), a.to_vector<double>()) << name;
  }
}

TEST(Safetensors, ReadsWhatTransformersWrote) {
  auto f = io::load_safetensors(std::string(KILN_FIXTURES_DIR) + "/vit_golden/model.safetensors");
  EXPECT_EQ(f.tensors.at("classifier.weight").shape(), (Shape{10, 32}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(Safetensors, SaveIsAtomic) {
  TempDir dir;
  std::string path = dir.file("w.safetensors");
  io::save_safetensors(path, {{"x", ones({3})}});
  // A failed save (here: an unsupported dtype is refused before writing)
  // leaves the previous file intact, and no temporary files behind.
  EXPECT_THROW(io::save_safetensors(path, {{"x", Array()}}), std::exception);
  EXPECT_EQ(io::load_safetensors(path).tensors.at("x").to_vector<float>(),
            (std::vector<float>{1, 1, 1}));
  int files = 0;
  for (auto& e : fs::directory_iterator(fs::path(path).parent_path())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* expected;  // a part of the message
};

TEST(Safetensors, MalformedFilesGetClearErrors) {
  TempDir dir;
  std::string f4(16, '\0');  // 4 f32 values
  std::vector<Malformed> cases = {
      {"too_short", "abc", "too short for a header"},
      {"header_length_past_end", file_bytes("{}", "", 1000), "header length 1000 exceeds the file"},
      {"huge_header_length", file_bytes("{}", "", int64_t{1} << 60), "exceeds the file"},
      {"not_json", file_bytes("{nope", ""), "not valid JSON"},
      {"not_object", file_bytes("[1,2]", ""), "not a JSON object"},
      {"unknown_dtype",
       file_bytes(R"({"x":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})",
                  std::string(4, '\0')),
       "dtype F8_E4M3"},
      {"offsets_out_of_range",
       file_bytes(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                  std::string(8, '\0')),
       "outside the 8 data bytes"},
      {"offsets_reversed",
       file_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", f4),
       "data_offsets [8, 4]"},
      {"size_mismatch",
       file_bytes(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", f4),
       "has 16 bytes, expected 12"},
      {"overlap",
       file_bytes(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  f4),
       "overlap"},
      {"truncated_data",
       file_bytes(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                  std::string(10, '\0')),
       "outside the 10 data bytes"},
      {"byte_count_wraps_to_zero",  // 2^62 elements of 8 bytes: 2^65 = 0 in 64 bits
       file_bytes(R"({"x":{"dtype":"F64","shape":[1099511627776,4194304],"data_offsets":[0,0]}})",
                  ""),
       "expected at most 2^60 elements"},
      {"negative_shape",
       file_bytes(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", ""),
       "not a non-negative integer"},
      {"missing_offsets", file_bytes(R"({"x":{"dtype":"F32","shape":[1]}})", f4),
       "no valid data_offsets"},
      {"bad_metadata", file_bytes(R"({"__metadata__":{"a":1}})", ""),
       "__metadata__.a is not a string"},
  };
  for (auto& c : cases) {
    std::string path = dir.file(std::string(c.name) + ".safetensors");
    write_raw(path, c.bytes);
    std::string err = load_error(path);
    EXPECT_NE(err.find("[safetensors] " + path), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(c.expected), std::string::npos) << c.name << ": " << err;
  }
  EXPECT_NE(load_error(dir.file("missing.safetensors")).find("cannot open"), std::string::npos);
}

}  // namespace
}  // namespace kiln
