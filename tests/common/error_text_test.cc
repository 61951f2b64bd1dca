// CutErrorText: texts that fit are kept; longer ones end with the count cut,
// within the limit, and no UTF-8 character is split.
#include "common/error_text.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(CutErrorTextTest, KeepsATextThatFits) {
  EXPECT_EQ(CutErrorText(""), "");
  const std::string full(kMaxErrorBytes, 'x');
  EXPECT_EQ(CutErrorText(full), full);
}

TEST(CutErrorTextTest, CutsALongTextWithinTheLimitAndSaysHowMuch) {
  const std::string text = std::string(kMaxErrorBytes, 'a') + "tail";
  const std::string cut = CutErrorText(text);
  EXPECT_LE(cut.size(), kMaxErrorBytes);
  EXPECT_EQ(cut.substr(0, 100), std::string(100, 'a'));
  const std::string marker = " ... (" +
                             std::to_string(text.size() - cut.find(" ... (")) +
                             " bytes cut)";
  EXPECT_EQ(cut.substr(cut.find(" ... (")), marker);
}

TEST(CutErrorTextTest, NeverSplitsACharacter) {
  // "é" is two bytes: for every limit the head ends on a boundary.
  std::string text;
  for (int i = 0; i < 40; ++i) text += "\xC3\xA9";
  for (size_t max = 20; max < text.size(); ++max) {
    const std::string cut = CutErrorText(text, max);
    ASSERT_LE(cut.size(), max);
    const size_t head = cut.find(" ... (");
    ASSERT_NE(head, std::string::npos) << max;
    EXPECT_EQ(head % 2, 0u) << max << ": " << cut;
    EXPECT_EQ(cut.substr(head),
              " ... (" + std::to_string(text.size() - head) + " bytes cut)");
  }
}

TEST(CutErrorTextTest, ALimitTooSmallForTheMarkerKeepsOnlyTheHead) {
  EXPECT_EQ(CutErrorText("\xC3\xA9\xC3\xA9\xC3\xA9", 3), "\xC3\xA9");
}

}  // namespace
}  // namespace gradsync
