// GRADSYNC_SIM_DEVICES, the number of simulated devices per node: 8 unless
// set, the value when it is a count in [1, 1024], a clear error otherwise,
// and the devices that exist follow it.
#include "worker/backend/sim_device.h"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

constexpr char kVariable[] = "GRADSYNC_SIM_DEVICES";

// Each case sets the variable as it needs; the one the test began with is
// restored after it.
class SimDeviceCountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* value = std::getenv(kVariable);
    if (value != nullptr) saved_ = value;
    ::unsetenv(kVariable);
  }
  void TearDown() override {
    if (saved_.has_value()) {
      ::setenv(kVariable, saved_->c_str(), 1);
    } else {
      ::unsetenv(kVariable);
    }
  }
  static void Set(const char* value) { ::setenv(kVariable, value, 1); }

 private:
  std::optional<std::string> saved_;
};

TEST_F(SimDeviceCountTest, UnsetOrEmptyIsEightDevices) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    if (value != nullptr) Set(value);
    absl::StatusOr<int> count = SimDeviceCount();
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_EQ(*count, 8);
  }
  absl::StatusOr<std::unique_ptr<NcclDevice>> last = CreateSimDevice(7);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->name(), "sim:7");
  absl::StatusOr<std::unique_ptr<NcclDevice>> past = CreateSimDevice(8);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(past.status().message(),
            "simulated device 8 does not exist (8 per node; "
            "GRADSYNC_SIM_DEVICES sets how many)");
}

TEST_F(SimDeviceCountTest, ASetCountIsTheNumberOfDevices) {
  Set("3");
  absl::StatusOr<int> count = SimDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 3);
  EXPECT_TRUE(CreateSimDevice(2).ok());
  absl::StatusOr<std::unique_ptr<NcclDevice>> past = CreateSimDevice(3);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.status().message(), HasSubstr("(3 per node;"));
  Set("1024");  // the largest allowed
  EXPECT_EQ(SimDeviceCount().value_or(0), 1024);
}

TEST_F(SimDeviceCountTest, ABadValueFailsNamingTheVariableAndTheValue) {
  for (const char* value : {"0", "-2", "1025", "eight", "4x", " "}) {
    SCOPED_TRACE(value);
    Set(value);
    absl::StatusOr<int> count = SimDeviceCount();
    EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(count.status().message(),
              std::string("GRADSYNC_SIM_DEVICES must be a count of simulated "
                          "devices per node in [1, 1024], got '") +
                  value + "'");
    // Every device fails the same way: no device without a valid count.
    EXPECT_EQ(CreateSimDevice(0).status(), count.status());
  }
}

}  // namespace
}  // namespace gradsync
