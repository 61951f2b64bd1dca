// Writes metric families in the Prometheus text exposition format (version
// 0.0.4) straight into a string: HELP and TYPE lines, then the samples.
//
// For the per-rank families only (prometheus_metrics.cc), whose samples grow with the
// ranks: prometheus-cpp's MetricFamily and TextSerializer write everything
// else, but building a ClientMetric per sample and formatting through an
// ostream made a scrape of 20,000 ranks (180,000 samples) 2.4-4.3x slower
// (bench/heartbeat_load --status_kinds=metrics, BENCHMARKS.md).
#ifndef GRADSYNC_SERVER_HTTP_PROMETHEUS_TEXT_H_
#define GRADSYNC_SERVER_HTTP_PROMETHEUS_TEXT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace gradsync {

// Label name/value pairs of one sample, in order.
using PrometheusLabels = std::vector<std::pair<absl::string_view, absl::string_view>>;

// Not thread-safe: one writer builds one exposition.
class PrometheusText {
 public:
  // Starts a family: `type` is "counter" or "gauge". Every sample of the
  // family must follow before the next Family().
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help);
  // One sample of the family `name`. Label values are escaped.
  void Sample(absl::string_view name, const PrometheusLabels& labels,
              double value);

  // The text written so far; the writer is left empty.
  std::string Take() { return std::move(out_); }

 private:
  void Labels(const PrometheusLabels& labels);
  std::string out_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_HTTP_PROMETHEUS_TEXT_H_
