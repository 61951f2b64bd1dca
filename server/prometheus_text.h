// Writes the Prometheus text exposition format (version 0.0.4): metric
// families with HELP and TYPE lines, then their samples.
#ifndef GRADSYNC_SERVER_PROMETHEUS_TEXT_H_
#define GRADSYNC_SERVER_PROMETHEUS_TEXT_H_

#include <cstdint>
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
  // Starts a family: `type` is "counter", "gauge" or "histogram". Every
  // sample of the family must follow before the next Family().
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help);
  // One sample; `name` is the family name, or for histograms the family name
  // plus "_bucket", "_sum" or "_count". Label values are escaped.
  void Sample(absl::string_view name, const PrometheusLabels& labels,
              double value);
  void Sample(absl::string_view name, const PrometheusLabels& labels,
              int64_t value);

  // The text written so far; the writer is left empty.
  std::string Take() { return std::move(out_); }

 private:
  void Labels(const PrometheusLabels& labels);
  std::string out_;
};

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_PROMETHEUS_TEXT_H_
