// The loss curves of a run as a self-contained SVG line chart (<out_dir>/loss.svg), drawn without Python or a
// plotting library: it reads the run's metrics.jsonl and builds the SVG text directly.
#pragma once

#include <string>

namespace strata::train {

// Draws the train and val loss of a run's metrics.jsonl as an SVG line chart; returns false (writing nothing)
// when the file holds no loss point. Written atomically (temp file + rename). Throws strata::Error naming
// the path when it cannot write.
//
// Reading the records: a line with an "event" key, a line that does not parse (the torn last line of a killed
// run) and a null or non-finite loss are skipped. When a step repeats (a resumed run re-logs the steps after
// its checkpoint) the later record wins. A missing or unreadable metrics file is an error naming that path.
//
// The y-range starts at the lowest loss; its top may leave out the first few points of the run when they sit
// far above everything else (the loss at initialisation), so the rest of the curve is not flattened. Points
// left out are counted in a note on the chart; a spike later in the run always stays inside the range.
bool writeLossPlot(const std::string& metricsJsonlPath, const std::string& svgPath, const std::string& title);

}  // namespace strata::train
