// What EtcdStorage adds to the conformance suite: its endpoints, errors when
// etcd does not answer, and the state format marker of its namespace,
// against a real etcd-server started by the test.
#include "server/storage/etcd_storage.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/etcd_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/ports.h"
#include "tests/testing/test_pki.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

TEST(EtcdStorageTest, ABadEndpointInAListIsNamed) {
  EtcdOptions options;
  options.endpoints = {"127.0.0.1:2379", "10.1:2379"};
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened =
      EtcdStorage::Open(options);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(opened.status().message(), HasSubstr("'10.1:2379'"));
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

// etcd refuses a request above its --max-request-bytes (1.5 MiB by
// default): a batch larger than that, of values each below it, is split
// and stored whole; one value above it is refused before it is sent,
// naming the key and the limit, and nothing of it is stored.
TEST_F(EtcdNamespaceTest, RequestsStayUnderEtcdsSizeLimit) {
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/sized/");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EtcdStorage& storage = **opened;
  std::vector<Storage::Mutation> batch;
  for (int i = 0; i < 6; ++i) {  // 6 x 700 KiB: 4.2 MiB in one batch
    Storage::Mutation put;
    put.key = absl::StrCat("big/", i);
    put.value = std::string(700 * 1024, static_cast<char>('a' + i));
    batch.push_back(std::move(put));
  }
  absl::Status applied = storage.Apply(batch);
  ASSERT_TRUE(applied.ok()) << applied;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<std::string> got = storage.Get(absl::StrCat("big/", i));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, batch[i].value);
  }

  const absl::Status too_big =
      storage.Put("huge", std::string(2 * 1024 * 1024, 'x'));
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted) << too_big;
  EXPECT_THAT(too_big.message(), HasSubstr("'huge'"));
  EXPECT_THAT(too_big.message(), HasSubstr("--etcd_max_request_bytes"));
  EXPECT_TRUE(absl::IsNotFound(storage.Get("huge").status()));
}

// Mutations joined by with_next are one transaction, where splitting by
// size alone would part them: x (700 KiB) and a (700 KiB) fit one request,
// a's partner b does not, so x goes alone and a and b together (one
// transaction: one etcd revision).
TEST_F(EtcdNamespaceTest, MutationsJoinedByWithNextAreOneTransaction) {
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/groups/");
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::vector<Storage::Mutation> batch(3);
  batch[0].key = "x";
  batch[0].value = std::string(700 * 1024, 'x');
  batch[1].key = "a";
  batch[1].value = std::string(700 * 1024, 'a');
  batch[1].with_next = true;
  batch[2].key = "b";
  batch[2].value = std::string(200 * 1024, 'b');
  absl::Status applied = (*opened)->Apply(batch);
  ASSERT_TRUE(applied.ok()) << applied;
  const auto revision = [&](const std::string& key) {
    grpc::ClientContext context;
    etcdserverpb::RangeRequest request;
    request.set_key(absl::StrCat("/groups/d/", key));
    request.set_keys_only(true);
    etcdserverpb::RangeResponse response;
    EXPECT_TRUE(kv_->Range(&context, request, &response).ok());
    return response.kvs_size() == 1 ? response.kvs(0).mod_revision() : -1;
  };
  ASSERT_GT(revision("a"), 0);
  EXPECT_EQ(revision("a"), revision("b"));
  EXPECT_NE(revision("x"), revision("a"));
}

// etcd serving its client API over TLS with client certificates
// (--client-cert-auth): the coordinator's storage with the CA and a client
// certificate (--etcd_tls_ca/cert/key) reads and writes; plaintext, a
// client without a certificate, and one that does not trust etcd's CA are
// refused, each with the endpoint named.
TEST(EtcdTlsTest, StorageWorksOverMutualTlsAndOthersAreRefused) {
  if (testing::EtcdProcess::Binary().empty()) {
    GTEST_SKIP() << "no etcd binary: install etcd-server";
  }
  const testing::TestCa ca = testing::MakeTestCa("etcd-tls");
  const testing::TestCert server = testing::MakeTestCert(ca, "etcd");
  const testing::TestCert client = testing::MakeTestCert(ca, "coordinator");
  const ClientTls trusted{ca.cert, client.cert, client.key};
  testing::EtcdProcess::Tls tls{server.cert, server.key, ca.cert, trusted};
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start("tls", &tls));

  auto open = [&](const ClientTls& with) {
    EtcdOptions options;
    options.endpoints = {etcd.endpoint()};
    options.prefix = "/tls/";
    options.call_timeout = absl::Seconds(2);
    options.tls = with;
    return EtcdStorage::Open(options);
  };
  absl::StatusOr<std::unique_ptr<EtcdStorage>> storage = open(trusted);
  ASSERT_TRUE(storage.ok()) << storage.status();
  ASSERT_TRUE((*storage)->Put("jobs/a", "over tls").ok());
  absl::StatusOr<std::string> read = (*storage)->Get("jobs/a");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "over tls");

  const testing::TestCa other = testing::MakeTestCa("etcd-other");
  for (const ClientTls& refused :
       {ClientTls(), ClientTls{ca.cert, "", ""},
        ClientTls{other.cert, client.cert, client.key}}) {
    absl::Status status = open(refused).status();
    EXPECT_FALSE(status.ok()) << "ca '" << refused.ca << "' cert '"
                              << refused.cert << "'";
    EXPECT_THAT(std::string(status.message()), HasSubstr(etcd.endpoint()));
  }
  EXPECT_EQ(open(ClientTls{"", client.cert, client.key}).status().code(),
            absl::StatusCode::kInvalidArgument);  // a certificate needs a CA
}

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

TEST_F(EtcdNamespaceTest, AnOlderReadableFormatIsRaisedAtOpen) {
  PutRaw("/older/format", absl::StrCat(kOldestStateFormat));
  PutRaw("/older/d/jobs/a", "record");
  EtcdOptions options;
  options.endpoints = {etcd_.endpoint()};
  options.prefix = "/older/";
  absl::StatusOr<StateSummary> checked = EtcdStorage::Check(options);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->format, kOldestStateFormat);  // a check writes nothing
  absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/older/");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ((*opened)->Get("jobs/a").value(), "record");
  checked = EtcdStorage::Check(options);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->format, kStateFormat);
}

TEST_F(EtcdNamespaceTest, CheckCountsWhatANamespaceHoldsAndWritesNothing) {
  EtcdOptions options;
  options.endpoints = {etcd_.endpoint()};
  options.prefix = "/checked/";
  absl::StatusOr<StateSummary> empty = EtcdStorage::Check(options);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr("no gradsync state under"));
  {
    // The check left no marker: the namespace is still new to Open.
    grpc::ClientContext context;
    etcdserverpb::RangeRequest request;
    request.set_key("/checked/");
    request.set_range_end("/checked0");
    request.set_count_only(true);
    etcdserverpb::RangeResponse response;
    ASSERT_TRUE(kv_->Range(&context, request, &response).ok());
    EXPECT_EQ(response.count(), 0);
  }
  {
    absl::StatusOr<std::unique_ptr<EtcdStorage>> opened = Open("/checked/");
    ASSERT_TRUE(opened.ok()) << opened.status();
    for (const char* key : {"jobs/a", "jobs/b", "jobs/b/changes/1/0",
                            "kv/train/1/x", "other"}) {
      ASSERT_TRUE((*opened)->Put(key, "v").ok());
    }
  }
  absl::StatusOr<StateSummary> summary = EtcdStorage::Check(options);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->format, kStateFormat);
  EXPECT_EQ(summary->entries, 5);
  EXPECT_EQ(summary->jobs, 2);
  EXPECT_EQ(summary->kv_keys, 1);
  // A foreign namespace is refused as by Open.
  PutRaw("/foreign/config", "theirs");
  options.prefix = "/foreign/";
  EXPECT_EQ(EtcdStorage::Check(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// Leadership and fencing

class EtcdLeadershipTest : public EtcdNamespaceTest {
 protected:
  // Opens the namespace "/ha/" as a replica that leads (blocking while
  // another leads); `lost` counts the losses it reports.
  absl::StatusOr<std::unique_ptr<EtcdStorage>> Lead(
      const std::string& address, std::atomic<int>* lost) {
    EtcdOptions options;
    options.endpoints = {etcd_.endpoint()};
    options.prefix = "/ha/";
    options.lead = true;
    options.leadership.address = address;
    options.leadership.standby_poll = absl::Milliseconds(20);
    options.on_lost_leadership = [lost](const absl::Status&) { ++*lost; };
    return EtcdStorage::Open(options);
  }

  void DeleteRaw(const std::string& key) {
    grpc::ClientContext context;
    etcdserverpb::DeleteRangeRequest request;
    request.set_key(key);
    etcdserverpb::DeleteRangeResponse response;
    ASSERT_TRUE(kv_->DeleteRange(&context, request, &response).ok());
  }
};

TEST_F(EtcdLeadershipTest, ADeposedLeaderCannotWrite) {
  std::atomic<int> a_lost{0}, b_lost{0};
  absl::StatusOr<std::unique_ptr<EtcdStorage>> a = Lead("a:1", &a_lost);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->Put("k", "from a").ok());
  // As if a's lease had expired while it was stopped: its key goes, and b
  // campaigns and leads.
  DeleteRaw("/ha/leader");
  absl::StatusOr<std::unique_ptr<EtcdStorage>> b = Lead("b:2", &b_lost);
  ASSERT_TRUE(b.ok()) << b.status();
  absl::Status refused = (*a)->Put("k", "late write from a");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("no longer leads"));
  EXPECT_EQ(a_lost.load(), 1) << "the refusal reports the loss";
  EXPECT_EQ((*a)->Apply({{Storage::Mutation::Kind::kPut, "other", "x"}}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*a)->DeletePrefix("").status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::string> kept = (*b)->Get("k");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "from a") << "nothing a wrote after it was deposed landed";
  EXPECT_EQ((*b)->Get("other").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*b)->Put("k", "from b").ok());
  EXPECT_EQ(b_lost.load(), 0);
}

TEST_F(EtcdLeadershipTest, AStandbyLeadsOnceTheLeaderResigns) {
  std::atomic<int> a_lost{0}, b_lost{0};
  absl::StatusOr<std::unique_ptr<EtcdStorage>> a = Lead("a:1", &a_lost);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::Notification b_leads;
  absl::StatusOr<std::unique_ptr<EtcdStorage>> b;
  std::thread standby([&] {
    b = Lead("b:2", &b_lost);
    b_leads.Notify();
  });
  EXPECT_FALSE(b_leads.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "b must stand by while a leads";
  const absl::Time resigned = absl::Now();
  a->reset();  // revokes a's lease
  ASSERT_TRUE(b_leads.WaitForNotificationWithTimeout(absl::Seconds(10)));
  standby.join();
  ASSERT_TRUE(b.ok()) << b.status();
  std::printf("the standby led %s after the leader resigned\n",
              absl::FormatDuration(absl::Now() - resigned).c_str());
  EXPECT_TRUE((*b)->Put("k", "v").ok());
  EXPECT_EQ(a_lost.load(), 0) << "resigning is not a loss";
}

TEST_F(EtcdLeadershipTest, AnExpiredLeaseIsReportedLost) {
  std::atomic<int> lost{0};
  absl::StatusOr<std::unique_ptr<EtcdStorage>> a = Lead("a:1", &lost);
  ASSERT_TRUE(a.ok()) << a.status();
  // Revoke every lease, as etcd does when renewals stop for the TTL.
  auto leases = etcdserverpb::Lease::NewStub(grpc::CreateChannel(
      etcd_.endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext list_context;
  etcdserverpb::LeaseLeasesResponse all;
  ASSERT_TRUE(leases->LeaseLeases(&list_context, {}, &all).ok());
  ASSERT_EQ(all.leases_size(), 1);
  grpc::ClientContext revoke_context;
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(all.leases(0).id());
  etcdserverpb::LeaseRevokeResponse revoked;
  ASSERT_TRUE(leases->LeaseRevoke(&revoke_context, revoke, &revoked).ok());
  EXPECT_TRUE(Eventually([&] { return lost.load() == 1; }, absl::Seconds(10)));
}

}  // namespace
}  // namespace gradsync
