#include "strata/train/LossPlot.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "TestUtil.h"
#include "strata/core/Error.h"

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;

using strata::test::errorOf;
using strata::test::freshDir;

namespace {

void writeLines(const fs::path& path, const std::vector<json>& records) {
  std::ofstream out(path);
  for (const json& r : records) out << r.dump() << "\n";
}

std::string readText(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The "x,y" pairs of the polyline with the given class.
std::vector<std::pair<double, double>> polylinePoints(const std::string& svg, const std::string& cls) {
  size_t at = svg.find("<polyline class=\"" + cls + "\"");
  if (at == std::string::npos) return {};
  size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
  std::istringstream in(svg.substr(begin, end - begin));
  std::vector<std::pair<double, double>> points;
  std::string pair;
  while (in >> pair) {
    size_t comma = pair.find(',');
    points.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return points;
}

size_t count(const std::string& text, const std::string& needle, size_t from = 0,
             size_t to = std::string::npos) {
  size_t n = 0;
  for (size_t at = text.find(needle, from); at != std::string::npos && at < to;
       at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

template <class F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double trainLoss(int step, std::mt19937& rng) {
  std::normal_distribution<double> noise(0.0, 0.06);
  return 1.4 + 4.1 * std::exp(-step / 250.0) + noise(rng);
}

// A 1500-step run logged every 10 steps with val every 500, killed at 1100 and resumed from the checkpoint at
// 1000: steps 1010-1100 appear twice. Step 700's loss is NaN (null in the file); an event record carries a
// loss at a step of its own that must not be drawn.
std::vector<json> resumedRun() {
  std::mt19937 rng(7);
  std::vector<json> records;
  for (int step = 10; step <= 1100; step += 10) {
    json r{{"step", step}, {"loss", trainLoss(step, rng) + 0.5}, {"lr", 3e-4}, {"grad_norm", 0.9}};
    if (step == 700) r["loss"] = nullptr;
    records.push_back(r);
    if (step % 500 == 0) records.push_back({{"step", step}, {"val_loss", trainLoss(step, rng) + 0.05}});
  }
  records.push_back({{"event", "resume"}, {"step", 1005}, {"loss", 9.9}});
  for (int step = 1010; step <= 1500; step += 10) {
    records.push_back({{"step", step}, {"loss", trainLoss(step, rng)}, {"lr", 3e-4}, {"grad_norm", 0.9}});
    if (step % 500 == 0) records.push_back({{"step", step}, {"val_loss", trainLoss(step, rng) + 0.05}});
  }
  return records;
}

}  // namespace

TEST_CASE("writeLossPlot draws the train and val curves of a metrics.jsonl", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-basic");
  writeLines(dir / "metrics.jsonl", resumedRun());
  {
    std::ofstream append(dir / "metrics.jsonl", std::ios::app);
    append << "{\"step\": 1510, \"loss\": 1.";  // the torn last line of a killed run
  }
  fs::path svgPath = dir / "loss.svg";
  REQUIRE(train::writeLossPlot((dir / "metrics.jsonl").string(), svgPath.string(), "gpt-nano <run a> & b"));
  std::string svg = readText(svgPath);
  REQUIRE(svg.rfind("<svg", 0) == 0);
  REQUIRE(svg.find("</svg>") != std::string::npos);
  REQUIRE_FALSE(fs::exists(svgPath.string() + ".tmp"));

  // 150 logged steps less the NaN one; the repeated steps count once and the event's loss not at all.
  auto trainPoints = polylinePoints(svg, "train-loss");
  REQUIRE(trainPoints.size() == 149);
  for (size_t i = 1; i < trainPoints.size(); ++i) REQUIRE(trainPoints[i].first > trainPoints[i - 1].first);
  auto valPoints = polylinePoints(svg, "val-loss");
  REQUIRE(valPoints.size() == 3);
  size_t markers = svg.find("class=\"val-markers\"");
  REQUIRE(markers != std::string::npos);
  REQUIRE(count(svg, "<circle", markers, svg.find("</g>", markers)) == 3);
  // Loss falls, so the curve climbs down the page: y grows in SVG coordinates.
  REQUIRE(trainPoints.back().second > trainPoints.front().second + 100);
  REQUIRE(valPoints.back().second > valPoints.front().second);

  REQUIRE(svg.find("train loss") != std::string::npos);
  REQUIRE(svg.find("val loss") != std::string::npos);
  REQUIRE(svg.find(">iteration<") != std::string::npos);
  REQUIRE(svg.find(">loss<") != std::string::npos);
  REQUIRE(svg.find("gpt-nano &lt;run a&gt; &amp; b") != std::string::npos);
  REQUIRE(svg.find("<run a>") == std::string::npos);
  // 1-2-5 ticks over 0..1500: 0, 200, ..., 1400.
  REQUIRE(svg.find(">1400</text>") != std::string::npos);
  REQUIRE(svg.find(">1500</text>") == std::string::npos);
  // Nothing sits far above the rest, so the range keeps every point.
  REQUIRE(svg.find("above the chart") == std::string::npos);
}

TEST_CASE("writeLossPlot keeps the loss at initialisation from flattening the curve", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-spike");
  std::mt19937 rng(3);
  std::vector<json> records;
  records.push_back({{"step", 0}, {"loss", 10.98}});
  records.push_back({{"step", 10}, {"loss", 9.7}});
  for (int step = 20; step <= 2000; step += 10)
    records.push_back({{"step", step}, {"loss", trainLoss(step, rng)}});
  writeLines(dir / "metrics.jsonl", records);
  REQUIRE(train::writeLossPlot((dir / "metrics.jsonl").string(), (dir / "loss.svg").string(), "spike"));
  std::string svg = readText(dir / "loss.svg");
  REQUIRE(polylinePoints(svg, "train-loss").size() == records.size());
  REQUIRE(svg.find("early points above the chart, up to 10.98 at iteration 0") != std::string::npos);

  // A spike late in the run is news, not noise: it stays inside the range.
  records.push_back({{"step", 2010}, {"loss", 12.0}});
  writeLines(dir / "metrics.jsonl", records);
  REQUIRE(train::writeLossPlot((dir / "metrics.jsonl").string(), (dir / "loss.svg").string(), "spike"));
  REQUIRE(readText(dir / "loss.svg").find("above the chart") == std::string::npos);
}

TEST_CASE("writeLossPlot thins a long run to the envelope of each pixel column", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-long");
  std::mt19937 rng(5);
  std::vector<json> records;
  for (int step = 1; step <= 100000; ++step) {
    records.push_back({{"step", step}, {"loss", trainLoss(step / 60, rng)}});
  }
  writeLines(dir / "metrics.jsonl", records);
  REQUIRE(train::writeLossPlot((dir / "metrics.jsonl").string(), (dir / "loss.svg").string(), "long"));
  auto points = polylinePoints(readText(dir / "loss.svg"), "train-loss");
  REQUIRE(points.size() >= 700);
  REQUIRE(points.size() <= 2000);
  for (size_t i = 1; i < points.size(); ++i) REQUIRE(points[i].first >= points[i - 1].first);
}

TEST_CASE("writeLossPlot draws a lone loss point as a marker", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-one");
  writeLines(dir / "metrics.jsonl", {{{"step", 42}, {"loss", 3.1}}});
  REQUIRE(train::writeLossPlot((dir / "metrics.jsonl").string(), (dir / "loss.svg").string(), "one"));
  std::string svg = readText(dir / "loss.svg");
  REQUIRE(polylinePoints(svg, "train-loss").size() == 1);
  REQUIRE(svg.find("class=\"train-marker\"") != std::string::npos);
  REQUIRE(svg.find("val loss") == std::string::npos);
  REQUIRE(svg.find("nan") == std::string::npos);
}

TEST_CASE("writeLossPlot returns false and writes nothing without a loss point", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-empty");
  writeLines(dir / "metrics.jsonl", {{{"event", "start"}, {"step", 0}, {"loss", 3.0}},
                                     {{"step", 10}, {"lr", 1e-4}},
                                     {{"step", 20}, {"loss", nullptr}}});
  REQUIRE_FALSE(train::writeLossPlot((dir / "metrics.jsonl").string(), (dir / "loss.svg").string(), "empty"));
  REQUIRE_FALSE(fs::exists(dir / "loss.svg"));
  REQUIRE_FALSE(fs::exists(dir / "loss.svg.tmp"));
}

TEST_CASE("writeLossPlot names the path it cannot read or write", "[train][lossplot]") {
  fs::path dir = freshDir("strata-lossplot-errors");
  writeLines(dir / "metrics.jsonl", {{{"step", 10}, {"loss", 3.0}}});
  std::string unwritable = (dir / "no-such-dir" / "loss.svg").string();
  std::string message =
      errorOf([&] { train::writeLossPlot((dir / "metrics.jsonl").string(), unwritable, "run"); });
  REQUIRE(message.find(unwritable) != std::string::npos);

  std::string missing = (dir / "missing.jsonl").string();
  message = errorOf([&] { train::writeLossPlot(missing, (dir / "loss.svg").string(), "run"); });
  REQUIRE(message.find(missing) != std::string::npos);
  REQUIRE_FALSE(fs::exists(dir / "loss.svg"));
}
