// kiln train: loss and accuracy curves of a --log-json file, as SVG.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/io.h"
#include "kiln/train.h"

namespace kiln::train {
namespace {

struct Series {
  std::vector<double> x, y;
  std::string color, label;
  bool markers = false;
};

// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target = 5) {
  double span = hi - lo;
  if (!(span > 0)) return {lo};
  double raw = span / target, mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

std::string num(double v) {
  std::ostringstream os;
  os << std::setprecision(4) << v;
  return os.str();
}

// One panel at (x0, y0) of size w x h.
void panel(std::ostringstream& svg, double x0, double y0, double w, double h,
           const std::string& title, const std::string& ylabel, const std::vector<Series>& series,
           double xmax) {
  double ylo = INFINITY, yhi = -INFINITY;
  for (auto& s : series)
    for (double v : s.y) ylo = std::min(ylo, v), yhi = std::max(yhi, v);
  if (!std::isfinite(ylo)) ylo = 0, yhi = 1;
  if (yhi - ylo < 1e-9) ylo -= 0.5, yhi += 0.5;
  double pad = 0.05 * (yhi - ylo);
  ylo -= pad, yhi += pad;
  const double l = x0 + 60, r = x0 + w - 15, t = y0 + 30, b = y0 + h - 45;
  auto px = [&](double x) { return l + (r - l) * x / std::max(xmax, 1.0); };
  auto py = [&](double y) { return b - (b - t) * (y - ylo) / (yhi - ylo); };
  svg << "<text x='" << (l + r) / 2 << "' y='" << y0 + 18
      << "' text-anchor='middle' font-size='14'>" << title << "</text>\n";
  svg << "<rect x='" << l << "' y='" << t << "' width='" << r - l << "' height='" << b - t
      << "' fill='none' stroke='#888'/>\n";
  for (double v : ticks(ylo, yhi)) {
    svg << "<line x1='" << l << "' x2='" << r << "' y1='" << py(v) << "' y2='" << py(v)
        << "' stroke='#eee'/>";
    svg << "<text x='" << l - 5 << "' y='" << py(v) + 4 << "' text-anchor='end' font-size='11'>"
        << num(v) << "</text>\n";
  }
  for (double v : ticks(0, xmax)) {
    svg << "<text x='" << px(v) << "' y='" << b + 15 << "' text-anchor='middle' font-size='11'>"
        << num(v) << "</text>\n";
  }
  svg << "<text x='" << (l + r) / 2 << "' y='" << b + 32
      << "' text-anchor='middle' font-size='12'>step</text>\n";
  svg << "<text x='" << x0 + 14 << "' y='" << (t + b) / 2 << "' font-size='12' "
      << "text-anchor='middle' transform='rotate(-90 " << x0 + 14 << " " << (t + b) / 2 << ")'>"
      << ylabel << "</text>\n";
  double ly = t + 14;
  for (auto& s : series) {
    if (s.x.empty()) continue;
    svg << "<polyline fill='none' stroke='" << s.color << "' stroke-width='1.5' points='";
    for (size_t i = 0; i < s.x.size(); ++i) svg << px(s.x[i]) << "," << py(s.y[i]) << " ";
    svg << "'/>\n";
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i)
        svg << "<circle cx='" << px(s.x[i]) << "' cy='" << py(s.y[i]) << "' r='3' fill='" << s.color
            << "'/>";
    svg << "<text x='" << r - 8 << "' y='" << ly << "' text-anchor='end' font-size='12' fill='"
        << s.color << "'>" << s.label << "</text>\n";
    ly += 16;
  }
}

}  // namespace

void plot_log(const std::string& log, const std::string& out) {
  if (out.size() < 4 || out.compare(out.size() - 4, 4, ".svg") != 0)
    fail("plot", "-o " + out + ": kiln plot writes SVG; give a file name ending in .svg");
  std::istringstream in(io::read_file(log, "plot"));
  Series train{{}, {}, "#1f77b4", "training loss"}, smooth{{}, {}, "#0b3d66", "moving average"};
  Series eval_loss{{}, {}, "#d62728", "test loss", true};
  Series eval_acc{{}, {}, "#2ca02c", "test accuracy (%)", true};
  int64_t line_no = 0;
  double xmax = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("plot", log + ":" + std::to_string(line_no) + ": not a JSON object (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("step")) continue;  // the summary line
    double step = j["step"].get<double>();
    xmax = std::max(xmax, step);
    if (j.contains("loss")) {
      train.x.push_back(step);
      train.y.push_back(j["loss"].get<double>());
    }
    if (j.contains("eval_loss")) {
      eval_loss.x.push_back(step);
      eval_loss.y.push_back(j["eval_loss"].get<double>());
      eval_acc.x.push_back(step);
      eval_acc.y.push_back(100 * j["eval_accuracy"].get<double>());
    }
  }
  if (train.x.empty() && eval_loss.x.empty())
    fail("plot", log + ": no step records (expected the output of kiln train --log-json)");
  // A moving average over ~1% of the steps makes a noisy loss readable.
  size_t win = std::max<size_t>(1, train.y.size() / 100);
  double acc = 0;
  for (size_t i = 0; i < train.y.size(); ++i) {
    acc += train.y[i];
    if (i >= win) acc -= train.y[i - win];
    if (i + 1 >= win) {
      smooth.x.push_back(train.x[i]);
      smooth.y.push_back(acc / win);
    }
  }
  if (win == 1) smooth.x.clear();
  std::ostringstream svg;
  svg << std::fixed << std::setprecision(1);
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='960' height='360' "
      << "font-family='sans-serif'>\n<rect width='960' height='360' fill='white'/>\n";
  panel(svg, 0, 0, 480, 360, "loss", "cross-entropy", {train, smooth, eval_loss}, xmax);
  panel(svg, 480, 0, 480, 360, "test accuracy", "top-1 (%)", {eval_acc}, xmax);
  svg << "</svg>\n";
  io::write_file_atomic(out, svg.str());
}

}  // namespace kiln::train
