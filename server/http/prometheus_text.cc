#include "server/http/prometheus_text.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsync {

void PrometheusText::Family(absl::string_view name, absl::string_view type,
                            absl::string_view help) {
  absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                  type, "\n");
}

void PrometheusText::Labels(const PrometheusLabels& labels) {
  if (labels.empty()) return;
  out_.push_back('{');
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out_.push_back(',');
    absl::StrAppend(&out_, labels[i].first, "=\"");
    for (char c : labels[i].second) {
      if (c == '\\') {
        out_ += "\\\\";
      } else if (c == '"') {
        out_ += "\\\"";
      } else if (c == '\n') {
        out_ += "\\n";
      } else {
        out_.push_back(c);
      }
    }
    out_.push_back('"');
  }
  out_.push_back('}');
}

void PrometheusText::Sample(absl::string_view name,
                            const PrometheusLabels& labels, double value) {
  out_.append(name.data(), name.size());
  Labels(labels);
  if (std::isnan(value)) {
    out_ += " NaN\n";
  } else if (std::isinf(value)) {
    out_ += value > 0 ? " +Inf\n" : " -Inf\n";
  } else {
    absl::StrAppendFormat(&out_, " %.15g\n", value);
  }
}

}  // namespace gradsync
