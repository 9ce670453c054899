#include "strata/train/LossPlot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "strata/core/Error.h"

namespace strata::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct LossPoint {
  double step = 0, loss = 0;
};

struct LossSeries {
  std::vector<LossPoint> train, val;
};

LossSeries readLossSeries(const std::string& path) {
  std::ifstream in(path);
  STRATA_USER_CHECK(in.is_open(), "cannot read metrics file {}", path);
  // Keyed by step so a record re-logged after a resume replaces the one from before it.
  std::map<double, double> train, val;
  auto take = [](const json& record, const char* key, double step, std::map<double, double>& into) {
    auto value = record.find(key);
    if (value == record.end()) return;
    if (value->is_number() && std::isfinite(value->get<double>())) {
      into[step] = value->get<double>();
    } else {
      into.erase(step);  // a null (NaN) loss in the later record: that step has no point now
    }
  };
  std::string line;
  while (std::getline(in, line)) {
    json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || record.contains("event")) continue;
    auto step = record.find("step");
    if (step == record.end() || !step->is_number()) continue;
    take(record, "loss", step->get<double>(), train);
    take(record, "val_loss", step->get<double>(), val);
  }
  LossSeries series;
  for (const auto& [step, loss] : train) series.train.push_back({step, loss});
  for (const auto& [step, loss] : val) series.val.push_back({step, loss});
  return series;
}

std::string xmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The 1-2-5 step nearest to span / targetTicks.
double niceStep(double span, int targetTicks) {
  double raw = span / targetTicks;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double fraction = raw / magnitude;
  double nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  return nice * magnitude;
}

std::vector<double> ticksWithin(double lo, double hi, double step) {
  std::vector<double> ticks;
  // Multiples of the step by integer index, so the labels do not pick up accumulated rounding.
  for (double k = std::ceil(lo / step - 1e-9); k <= std::floor(hi / step + 1e-9); ++k)
    ticks.push_back(k * step);
  return ticks;
}

// Enough decimals for the step (a 1-2-5 step needs no more than its leading digit); k and M for large steps.
std::string tickLabel(double value, double step) {
  double scale = 1;
  const char* suffix = "";
  if (step >= 1e6) {
    scale = 1e6, suffix = "M";
  } else if (step >= 1e3) {
    scale = 1e3, suffix = "k";
  }
  int decimals = std::max(0, int(-std::floor(std::log10(step / scale) + 1e-9)));
  if (std::abs(value) < step * 1e-6) return fmt::format("{:.{}f}", 0.0, decimals);  // "0", not "-0" or "0k"
  return fmt::format("{:.{}f}{}", value / scale, decimals, suffix);
}

struct Axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};

Axis axisOver(double lo, double hi, int targetTicks, double minStep = 0) {
  Axis axis{lo, hi, std::max(niceStep(hi - lo, targetTicks), minStep), {}};
  axis.ticks = ticksWithin(lo, hi, axis.step);
  return axis;
}

// Keeps the lowest and highest point of each pixel column, in step order, so a long run logged every step
// draws the same envelope from a polyline of a few thousand points.
std::vector<LossPoint> decimate(const std::vector<LossPoint>& points, const Axis& x, int columns) {
  if (points.size() <= size_t(4 * columns)) return points;
  auto columnOf = [&](const LossPoint& p) {
    return std::clamp(int((p.step - x.lo) / (x.hi - x.lo) * columns), 0, columns - 1);
  };
  std::vector<LossPoint> kept;
  for (size_t i = 0; i < points.size();) {
    int column = columnOf(points[i]);
    size_t lowest = i, highest = i, j = i;
    for (; j < points.size() && columnOf(points[j]) == column; ++j) {
      if (points[j].loss < points[lowest].loss) lowest = j;
      if (points[j].loss > points[highest].loss) highest = j;
    }
    kept.push_back(points[std::min(lowest, highest)]);
    if (lowest != highest) kept.push_back(points[std::max(lowest, highest)]);
    i = j;
  }
  return kept;
}

struct Frame {
  double width = 800, height = 480;
  double left = 70, right = 24, top = 54, bottom = 54;
  double plotWidth() const { return width - left - right; }
  double plotHeight() const { return height - top - bottom; }
};

struct Rect {
  double x, y, w, h;
  bool contains(double px, double py) const { return px >= x && px <= x + w && py >= y && py <= y + h; }
};

// How many of the lines' sample points (every ~3 px along each segment) fall inside the box.
int lineSamplesInside(const Rect& box, const std::vector<std::vector<std::pair<double, double>>>& lines) {
  int inside = 0;
  for (const auto& line : lines) {
    for (size_t i = 0; i < line.size(); ++i) {
      auto [x0, y0] = line[i];
      auto [x1, y1] = i + 1 < line.size() ? line[i + 1] : line[i];
      int samples = std::max(1, int(std::hypot(x1 - x0, y1 - y0) / 3));
      for (int s = 0; s < samples; ++s) {
        double t = double(s) / samples;
        inside += box.contains(x0 + t * (x1 - x0), y0 + t * (y1 - y0));
      }
    }
  }
  return inside;
}

std::string formatLoss(double v) {
  return fmt::format("{:.4g}", v);
}
std::string formatStep(double step) {
  return fmt::format("{:.0f}", step);
}

std::string renderSvg(const LossSeries& series, const std::string& title) {
  const Frame f;
  std::vector<LossPoint> all = series.train;
  all.insert(all.end(), series.val.begin(), series.val.end());

  double firstStep = all[0].step, lastStep = all[0].step;
  double lowest = all[0].loss, highest = all[0].loss;
  for (const LossPoint& p : all) {
    firstStep = std::min(firstStep, p.step), lastStep = std::max(lastStep, p.step);
    lowest = std::min(lowest, p.loss), highest = std::max(highest, p.loss);
  }

  // x from 0 when the run starts near it, so runs read against the same origin.
  double xLo = firstStep >= 0 && (firstStep <= 0.1 * lastStep || firstStep == lastStep) ? 0 : firstStep;
  double xHi = lastStep > xLo ? lastStep : xLo + 1;
  Axis x = axisOver(xLo, xHi, std::max(3, int(f.plotWidth() / 95)), /*minStep=*/1);

  // The top of the y-range: the loss at initialisation can sit far above the rest of the run and squash it
  // into a few pixels. Only points in the first 10% of the steps may be left above the top, and only when
  // that makes the range at least 2x tighter; the note on the chart says how many were left out.
  double top = highest;
  if (all.size() >= 10) {
    std::vector<double> losses;
    for (const LossPoint& p : all) losses.push_back(p.loss);
    std::sort(losses.begin(), losses.end());
    double candidate = losses[size_t(0.98 * double(losses.size() - 1))];
    double earlyEnd = firstStep + 0.1 * (lastStep - firstStep);
    for (const LossPoint& p : all) {
      if (p.step > earlyEnd) candidate = std::max(candidate, p.loss);
    }
    if (highest - lowest > 2 * (candidate - lowest)) top = candidate;
  }
  double span = top - lowest;
  if (span <= 0) {  // one value: centre it in a range of 10% of itself
    span = std::max(0.1 * std::abs(lowest), 0.1);
    lowest -= span / 2, top += span / 2;
  }
  Axis y = axisOver(lowest - 0.05 * span, top + 0.05 * span, std::max(3, int(f.plotHeight() / 60)));

  auto px = [&](double step) { return f.left + (step - x.lo) / (x.hi - x.lo) * f.plotWidth(); };
  auto py = [&](double loss) { return f.top + (y.hi - loss) / (y.hi - y.lo) * f.plotHeight(); };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      f.width, f.height);
  // Markers at the right edge stick out of the plot by their radius; the clip lets them, but cuts lines at
  // the top and bottom of the frame.
  svg += fmt::format(
      "<defs><clipPath id=\"strata-loss-plot-area\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
      "height=\"{:.1f}\"/></clipPath></defs>\n",
      f.left - 6, f.top, f.plotWidth() + 12, f.plotHeight());
  if (!title.empty()) {
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"26\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\" "
        "fill=\"#222222\">{}</text>\n",
        f.width / 2, xmlEscape(title));
  }

  // Grid, tick marks and tick labels.
  svg += "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  for (double t : x.ticks) {
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\"/>\n", px(t), f.top,
                       f.top + f.plotHeight());
  }
  for (double t : y.ticks) {
    svg += fmt::format("<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\"/>\n", py(t), f.left,
                       f.left + f.plotWidth());
  }
  svg += "</g>\n<g fill=\"#444444\">\n";
  double axisY = f.top + f.plotHeight();
  for (double t : x.ticks) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#888888\"/>"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4}</text>\n",
        px(t), axisY, axisY + 4, axisY + 18, tickLabel(t, x.step));
  }
  for (double t : y.ticks) {
    svg += fmt::format(
        "<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\" stroke=\"#888888\"/>"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        py(t), f.left - 4, f.left, f.left - 7, py(t) + 4, tickLabel(t, y.step));
  }
  svg += "</g>\n";
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#888888\"/>\n",
      f.left, f.top, f.plotWidth(), f.plotHeight());
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\" "
      "fill=\"#222222\">iteration</text>\n",
      f.left + f.plotWidth() / 2, f.height - 12);
  svg += fmt::format(
      "<text transform=\"translate(18 {:.1f}) rotate(-90)\" text-anchor=\"middle\" font-size=\"13\" "
      "fill=\"#222222\">loss</text>\n",
      f.top + f.plotHeight() / 2);

  // The curves, in pixels.
  const char* trainColour = "#1f77b4";
  const char* valColour = "#e8590c";
  std::vector<std::vector<std::pair<double, double>>> lines;
  for (const auto* points : {&series.train, &series.val}) {
    std::vector<LossPoint> drawn =
        points == &series.train ? decimate(*points, x, int(f.plotWidth())) : *points;
    std::vector<std::pair<double, double>> line;
    for (const LossPoint& p : drawn) line.push_back({px(p.step), py(p.loss)});
    lines.push_back(std::move(line));
  }
  auto polyline = [](const std::vector<std::pair<double, double>>& line) {
    std::string coordinates;
    for (const auto& [lx, ly] : line) {
      coordinates += fmt::format("{}{:.1f},{:.1f}", coordinates.empty() ? "" : " ", lx, ly);
    }
    return coordinates;
  };
  svg +=
      "<g clip-path=\"url(#strata-loss-plot-area)\" fill=\"none\" stroke-linejoin=\"round\" "
      "stroke-linecap=\"round\">\n";
  if (!lines[0].empty()) {
    svg += fmt::format("<polyline class=\"train-loss\" stroke=\"{}\" stroke-width=\"1.2\" points=\"{}\"/>\n",
                       trainColour, polyline(lines[0]));
  }
  if (lines[0].size() == 1) {  // a lone point draws no line
    svg += fmt::format("<circle class=\"train-marker\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
                       lines[0][0].first, lines[0][0].second, trainColour);
  }
  if (!lines[1].empty()) {
    svg += fmt::format("<polyline class=\"val-loss\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                       valColour, polyline(lines[1]));
    svg += fmt::format("<g class=\"val-markers\" fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"1\">\n",
                       valColour);
    for (const auto& [lx, ly] : lines[1])
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\"/>\n", lx, ly);
    svg += "</g>\n";
  }
  svg += "</g>\n";

  // Points above the top of the range, said out loud so the chart does not hide them.
  int above = 0;
  const LossPoint* peak = &all[0];
  for (const LossPoint& p : all) {
    above += p.loss > y.hi;
    if (p.loss > peak->loss) peak = &p;
  }
  if (above > 0) {
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\" fill=\"#666666\">{} early "
        "point{} above the chart, up to {} at iteration {}</text>\n",
        f.left + f.plotWidth(), f.top - 8, above, above == 1 ? "" : "s", formatLoss(peak->loss),
        formatStep(peak->step));
  }

  // The legend, in the corner of the plot that the curves cross least.
  struct Entry {
    const char* colour;
    bool marker;
    std::string label, detail;
  };
  std::vector<Entry> entries;
  if (!series.train.empty()) {
    entries.push_back({trainColour, false, "train loss", "last " + formatLoss(series.train.back().loss)});
  }
  if (!series.val.empty()) {
    auto best = std::min_element(series.val.begin(), series.val.end(),
                                 [](const LossPoint& a, const LossPoint& b) { return a.loss < b.loss; });
    entries.push_back({valColour, true, "val loss",
                       "best " + formatLoss(best->loss) + " at iteration " + formatStep(best->step)});
  }
  size_t longest = 0;
  for (const Entry& e : entries) longest = std::max(longest, e.label.size() + e.detail.size() + 1);
  const double rowHeight = 18, margin = 8;
  double boxWidth = 44 + 6.6 * double(longest), boxHeight = 8 + rowHeight * double(entries.size());
  std::vector<Rect> corners = {
      {f.left + f.plotWidth() - boxWidth - margin, f.top + margin, boxWidth, boxHeight},
      {f.left + margin, f.top + f.plotHeight() - boxHeight - margin, boxWidth, boxHeight},
      {f.left + f.plotWidth() - boxWidth - margin, f.top + f.plotHeight() - boxHeight - margin, boxWidth,
       boxHeight},
      {f.left + margin, f.top + margin, boxWidth, boxHeight}};
  Rect box = corners[0];
  int fewest = lineSamplesInside(box, lines);
  for (size_t i = 1; i < corners.size() && fewest > 0; ++i) {
    int crossings = lineSamplesInside(corners[i], lines);
    if (crossings < fewest) box = corners[i], fewest = crossings;
  }
  svg += fmt::format(
      "<g class=\"legend\"><rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" rx=\"3\" "
      "fill=\"#ffffff\" fill-opacity=\"0.9\" stroke=\"#cccccc\"/>\n",
      box.x, box.y, box.w, box.h);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    double rowY = box.y + 4 + rowHeight * (double(i) + 0.5);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" stroke-width=\"2\"/>",
        box.x + 8, rowY, box.x + 32, rowY, e.colour);
    if (e.marker) {
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\" stroke=\"#ffffff\"/>",
                         box.x + 20, rowY, e.colour);
    }
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#222222\">{} <tspan fill=\"#777777\">{}</tspan></text>\n",
        box.x + 38, rowY + 4, e.label, e.detail);
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  STRATA_USER_CHECK(out.is_open(), "cannot write loss plot {} ({})", path, std::strerror(errno));
  out << text;
  out.close();
  std::error_code ignored;
  if (!out) {
    fs::remove(tmp, ignored);
    STRATA_USER_FAIL("cannot write loss plot {}", path);
  }
  std::error_code renamed;
  fs::rename(tmp, path, renamed);
  if (renamed) {
    fs::remove(tmp, ignored);
    STRATA_USER_FAIL("cannot write loss plot {} ({})", path, renamed.message());
  }
}

}  // namespace

bool writeLossPlot(const std::string& metricsJsonlPath, const std::string& svgPath,
                   const std::string& title) {
  LossSeries series = readLossSeries(metricsJsonlPath);
  if (series.train.empty() && series.val.empty()) return false;
  writeFileAtomically(svgPath, renderSvg(series, title));
  return true;
}

}  // namespace strata::train
