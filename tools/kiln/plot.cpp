// kiln plot: loss and accuracy curves of a `kiln train --log-json` file, as
// PNG or SVG (drawn with cairo, which only the kiln command links, not libkiln).
#include "plot.h"

#include <cairo-svg.h>
#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/io.h"

namespace kiln::tools {
namespace {

struct Series {
  std::vector<double> x, y;
  std::string color, label;
  bool markers = false;
};

// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target = 5) {
  double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) return {lo};
  double raw = span / target, mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  // Multiples of step (no accumulated rounding: 0 stays 0, not -1e-17). At
  // most 2 * target + 1 of them: a range narrow next to its values (losses
  // 1e10 and 1e10 + 2e-6) has a step below their precision, where k + 1 == k.
  const double first = std::ceil(lo / step);
  for (int i = 0; i <= 2 * target && (first + i) * step <= hi + step * 1e-9; ++i)
    t.push_back((first + i) * step);
  return t;
}

std::string num(double v) {
  if (v == 0) v = 0;  // no "-0"
  std::ostringstream os;
  os << std::setprecision(4) << v;
  return os.str();
}

struct Rgb {
  double r, g, b;
};
Rgb rgb(const std::string& hex) {  // "#rrggbb"
  auto byte = [&](int i) { return std::stoi(hex.substr(1 + 2 * i, 2), nullptr, 16) / 255.0; };
  return {byte(0), byte(1), byte(2)};
}

enum class Align { Left, Center, Right };

// Text whose baseline starts, centres or ends at (x, y), rotated by `angle`.
void text(cairo_t* cr, double x, double y, const std::string& s, double size, Align align,
          const std::string& color = "#000000", double angle = 0) {
  cairo_save(cr);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  const Rgb c = rgb(color);
  cairo_set_source_rgb(cr, c.r, c.g, c.b);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  double dx = align == Align::Left ? 0 : align == Align::Center ? -e.x_advance / 2 : -e.x_advance;
  cairo_move_to(cr, dx, 0);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

void line(cairo_t* cr, double x1, double y1, double x2, double y2, const std::string& color) {
  const Rgb c = rgb(color);
  cairo_set_source_rgb(cr, c.r, c.g, c.b);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, x1, y1);
  cairo_line_to(cr, x2, y2);
  cairo_stroke(cr);
}

// One panel at (x0, y0) of size w x h.
void panel(cairo_t* cr, double x0, double y0, double w, double h, const std::string& title,
           const std::string& ylabel, const std::vector<Series>& series, double xmax) {
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
  text(cr, (l + r) / 2, y0 + 18, title, 14, Align::Center);
  for (double v : ticks(ylo, yhi)) {
    line(cr, l, py(v), r, py(v), "#eeeeee");
    text(cr, l - 5, py(v) + 4, num(v), 11, Align::Right);
  }
  for (double v : ticks(0, xmax)) text(cr, px(v), b + 15, num(v), 11, Align::Center);
  cairo_set_source_rgb(cr, 0.53, 0.53, 0.53);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, l, t, r - l, b - t);
  cairo_stroke(cr);
  text(cr, (l + r) / 2, b + 32, "step", 12, Align::Center);
  text(cr, x0 + 18, (t + b) / 2, ylabel, 12, Align::Center, "#000000", -M_PI / 2);
  for (auto& s : series) {
    if (s.x.empty()) continue;
    const Rgb c = rgb(s.color);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 1.5);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    cairo_new_path(cr);  // text leaves a current point behind
    for (size_t i = 0; i < s.x.size(); ++i) cairo_line_to(cr, px(s.x[i]), py(s.y[i]));
    cairo_stroke(cr);
    if (s.markers)
      for (size_t i = 0; i < s.x.size(); ++i) {
        cairo_new_sub_path(cr);
        cairo_arc(cr, px(s.x[i]), py(s.y[i]), 3, 0, 2 * M_PI);
        cairo_fill(cr);
      }
  }
  // The legend, on a translucent white box so that it stays readable over
  // the curves.
  double ly = t + 14;
  for (auto& s : series) {
    if (s.x.empty()) continue;
    cairo_set_font_size(cr, 12);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.label.c_str(), &e);
    cairo_set_source_rgba(cr, 1, 1, 1, 0.8);
    cairo_rectangle(cr, r - 8 - e.x_advance - 3, ly - 12, e.x_advance + 6, 16);
    cairo_fill(cr);
    text(cr, r - 8, ly, s.label, 12, Align::Right, s.color);
    ly += 16;
  }
}

cairo_status_t append(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

void plot_log(const std::string& log, const std::string& out) {
  const bool png = ends_with(out, ".png");
  if (!png && !ends_with(out, ".svg"))
    fail("plot",
         "-o " + out + ": kiln plot writes PNG or SVG; give a file name ending in .png or .svg");
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
    // A field's number; null (how JSON writes a NaN or Inf) is NaN, and the
    // point is left out.
    auto number = [&](const char* key) {
      const auto& v = j[key];
      if (v.is_null() && std::string(key) != "step") return std::nan("");
      if (!v.is_number())
        fail("plot", log + ":" + std::to_string(line_no) + ": field '" + key + "' is " + v.dump() +
                         ", expected a number");
      return v.get<double>();
    };
    const double step = number("step");
    xmax = std::max(xmax, step);
    auto point = [&](Series& s, double y) {
      if (std::isfinite(y)) s.x.push_back(step), s.y.push_back(y);
    };
    if (j.contains("loss")) point(train, number("loss"));
    if (j.contains("eval_loss")) {
      point(eval_loss, number("eval_loss"));
      point(eval_acc, 100 * number("eval_accuracy"));
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
  // Drawn with cairo in 960 x 360 units: a PNG at twice that in pixels, or
  // an SVG; written atomically.
  constexpr double kW = 960, kH = 360, kPngScale = 2;
  std::string bytes;
  cairo_surface_t* surface =
      png ? cairo_image_surface_create(CAIRO_FORMAT_RGB24, static_cast<int>(kW * kPngScale),
                                       static_cast<int>(kH * kPngScale))
          : cairo_svg_surface_create_for_stream(append, &bytes, kW, kH);
  cairo_t* cr = cairo_create(surface);
  if (png) cairo_scale(cr, kPngScale, kPngScale);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  panel(cr, 0, 0, 480, 360, "loss", "cross-entropy", {train, smooth, eval_loss}, xmax);
  panel(cr, 480, 0, 480, 360, "test accuracy", "top-1 (%)", {eval_acc}, xmax);
  cairo_status_t status = cairo_status(cr);
  cairo_destroy(cr);
  if (png && status == CAIRO_STATUS_SUCCESS)
    status = cairo_surface_write_to_png_stream(surface, append, &bytes);
  cairo_surface_finish(surface);
  if (status == CAIRO_STATUS_SUCCESS) status = cairo_surface_status(surface);
  cairo_surface_destroy(surface);
  if (status != CAIRO_STATUS_SUCCESS)
    fail("plot",
         "-o " + out + ": cairo could not draw the plot (" + cairo_status_to_string(status) + ")");
  io::write_file_atomic(out, bytes);
}

}  // namespace kiln::tools
