// What EtcdStorage adds to the conformance suite: its endpoints, errors when
// etcd does not answer, and the state format marker of its namespace,
// against a real etcd-server started by the test.
#include "server/storage/etcd_storage.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/ports.h"

namespace gradsync {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseEtcdEndpointsTest, SplitsHostPortListsAndNamesTheBadEntry) {
  absl::StatusOr<std::vector<std::string>> two =
      ParseEtcdEndpoints("10.0.0.1:2379,etcd-b:2379");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_THAT(*two, ElementsAre("10.0.0.1:2379", "etcd-b:2379"));
  for (const std::string bad : {"", "10.0.0.1", ":2379", "h:0", "h:x", "a:1,"}) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseEtcdEndpoints(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << bad << "'";
  }
}

TEST(EtcdStorageTest, SeveralEndpointsMustBeAddresses) {
  EtcdOptions options;
  options.endpoints = {"etcd-a:2379", "etcd-b:2379"};
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened =
      EtcdStorage::Open(options);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr("'etcd-a:2379'"));
}

TEST(EtcdStorageTest, AnEtcdThatDoesNotAnswerFailsOpenWithinTheTimeout) {
  EtcdOptions options;
  const std::string endpoint = absl::StrCat("127.0.0.1:", PickUnusedPort());
  options.endpoints = {endpoint};
  options.call_timeout = absl::Milliseconds(500);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened =
      EtcdStorage::Open(options);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kDeadlineExceeded)
      << opened.status();
  EXPECT_THAT(opened.status().message(), HasSubstr(endpoint));
}

class EtcdNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary: install etcd-server";
    }
    ASSERT_TRUE(etcd_.Start("namespace"));
    kv_ = etcdserverpb::KV::NewStub(grpc::CreateChannel(
        etcd_.endpoint(), grpc::InsecureChannelCredentials()));
  }

  absl::StatusOr<std::unique_ptr<EtcdStorage>> Open(const std::string& prefix) {
    EtcdOptions options;
    options.endpoints = {etcd_.endpoint()};
    options.prefix = prefix;
    return EtcdStorage::Open(options);
  }

  // Writes `key` = `value` into etcd as is, past the storage.
  void PutRaw(const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    etcdserverpb::PutResponse response;
    ASSERT_TRUE(kv_->Put(&context, request, &response).ok());
  }

  testing::EtcdProcess etcd_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
};

TEST_F(EtcdNamespaceTest, ANewNamespaceIsMarkedAndOpensAgainWithItsKeys) {
  {
    absl::StatusOr<std::unique_ptr<EtcdStorage>> first = Open("/job-state/");
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE((*first)->Put("jobs/a", "record").ok());
  }
  absl::StatusOr<std::unique_ptr<EtcdStorage>> again = Open("/job-state/");
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<std::string> record = (*again)->Get("jobs/a");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(*record, "record");
}

TEST_F(EtcdNamespaceTest, KeysWithoutAFormatMarkerAreRefusedAndKept) {
  PutRaw("/someone-else/config", "theirs");
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/someone-else/");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(), HasSubstr("not a gradsync state"));
  EXPECT_THAT(opened.status().message(), HasSubstr("--etcd_prefix"));
}

TEST_F(EtcdNamespaceTest, AnotherFormatIsRefused) {
  PutRaw("/newer/format", absl::StrCat(kStateFormat + 1));
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/newer/");
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(opened.status().message(),
              HasSubstr(absl::StrCat("has format '", kStateFormat + 1, "'")));
}

}  // namespace
}  // namespace gradsync
