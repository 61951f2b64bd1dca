#include "common/error_text.h"

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// The longest head of `text` of at most `bytes` that ends at a UTF-8
// character boundary (`bytes` < text.size()).
absl::string_view HeadOf(absl::string_view text, size_t bytes) {
  // Back off continuation bytes (10xxxxxx) so that no character is split.
  while (bytes > 0 &&
         (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) {
    --bytes;
  }
  return text.substr(0, bytes);
}

}  // namespace

std::string CutErrorText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  // The count's digits in the marker are at most those of text.size().
  const size_t marker_size =
      absl::StrCat(" ... (", text.size(), " bytes cut)").size();
  if (marker_size >= max_bytes) return std::string(HeadOf(text, max_bytes));
  const absl::string_view head = HeadOf(text, max_bytes - marker_size);
  return absl::StrCat(head, " ... (", text.size() - head.size(), " bytes cut)");
}

}  // namespace gradsync
