#include "common/host_ports.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseHostPortsTest, SplitsListsAndNamesTheBadEntry) {
  absl::StatusOr<std::vector<std::string>> two =
      ParseHostPorts("10.0.0.1:2379,etcd-b:2379", "etcd endpoint", "h:1");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(*two, ElementsAre("10.0.0.1:2379", "etcd-b:2379"));
  for (const std::string bad : {"", "10.0.0.1", ":2379", "h:0", "h:65536",
                                "h:x", "a:1,"}) {
    absl::StatusOr<std::vector<std::string>> parsed =
        ParseHostPorts(bad, "coordinator address", "127.0.0.1:29400");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "'";
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("is not HOST:PORT (e.g. 127.0.0.1:29400)"));
  }
}

TEST(FailoverTargetTest, OneAsItIsSeveralAsIpv4List) {
  EXPECT_EQ(FailoverTarget({"coord:29400"}, "coordinator address").value(),
            "coord:29400");
  EXPECT_EQ(FailoverTarget({"10.0.0.1:1"}, "x").value(), "ipv4:10.0.0.1:1");
  EXPECT_EQ(FailoverTarget({"10.0.0.1:1", "10.0.0.2:2"}, "x").value(),
            "ipv4:10.0.0.1:1,10.0.0.2:2");
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{
           {}, {"10.0.0.1:1", "10.0.0.256:2"}, {"10.0.0.1:1", "10.0.1:2"}}) {
    EXPECT_EQ(FailoverTarget(bad, "coordinator address").status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(FailoverTargetTest, NamesInAListAreResolvedToTheirIpv4Addresses) {
  // localhost is 127.0.0.1 in /etc/hosts; its entry appears once.
  EXPECT_EQ(FailoverTarget({"10.0.0.1:1", "localhost:2", "127.0.0.1:2"}, "x")
                .value(),
            "ipv4:10.0.0.1:1,127.0.0.1:2");
}

}  // namespace
}  // namespace gradsync
