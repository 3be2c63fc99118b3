// kiln plot: the drawing of a `kiln train --log-json` file (cairo; part of
// the kiln-tools library, outside libkiln).
#pragma once
#include <string>

namespace kiln::tools {

// Draws the loss (training steps and evaluations) and the test accuracy of a
// `kiln train --log-json` file as a PNG or SVG image (by `out`'s extension),
// written atomically to `out`.
void plot_log(const std::string& log, const std::string& out);

}  // namespace kiln::tools
