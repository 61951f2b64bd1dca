#include "server/authenticator.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/storage/in_memory_storage.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Bearer(const std::string& token) {
  return absl::StrCat("Bearer ", token);
}

TEST(AuthenticatorTest, WithoutTokensEveryCallerIsTheAdmin) {
  InMemoryStorage storage;
  Authenticator auth(&storage, "");
  EXPECT_FALSE(auth.enabled());
  absl::StatusOr<Caller> caller = auth.Identify(nullptr);
  ASSERT_TRUE(caller.ok());
  EXPECT_TRUE(caller->admin);
  EXPECT_TRUE(absl::IsFailedPrecondition(auth.IssueToken("a").status()));
}

TEST(AuthenticatorTest, TokensNameTheirCallerAndAJobTokenActsOnlyInItsJob) {
  InMemoryStorage storage;
  Authenticator auth(&storage, "admin-secret");
  const std::string a = *auth.IssueToken("a");
  EXPECT_EQ(a.size(), 64u);  // 256 bits in hex

  const std::string admin = Bearer("admin-secret");
  ASSERT_TRUE(auth.Identify(&admin).ok());
  EXPECT_TRUE(auth.Identify(&admin)->admin);
  const std::string bearer_a = Bearer(a);
  absl::StatusOr<Caller> caller = auth.Identify(&bearer_a);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_FALSE(caller->admin);
  EXPECT_EQ(caller->job_id, "a");
  EXPECT_TRUE(Authenticator::Authorize(*caller, "a").ok());
  absl::Status denied = Authenticator::Authorize(*caller, "b");
  EXPECT_TRUE(absl::IsPermissionDenied(denied)) << denied;
  EXPECT_THAT(denied.message(), HasSubstr("for job 'a', not job 'b'"));

  for (const std::string& bad :
       {std::string("admin-secret"), std::string("Bearer "),
        std::string("Basic abc"), Bearer("wrong"), Bearer(a + "x")}) {
    absl::StatusOr<Caller> refused = auth.Identify(&bad);
    EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << bad;
    EXPECT_THAT(refused.status().message(), Not(HasSubstr(a)));
  }
  EXPECT_TRUE(absl::IsUnauthenticated(auth.Identify(nullptr).status()));
}

TEST(AuthenticatorTest, OnlyHashesAreStoredAndTheyOutliveARestart) {
  InMemoryStorage storage;
  std::string a;
  {
    Authenticator auth(&storage, "admin-secret");
    const std::string old = *auth.IssueToken("a");
    a = *auth.IssueToken("a");  // a new token replaces the old one
    const std::string bearer_old = Bearer(old);
    EXPECT_TRUE(absl::IsUnauthenticated(auth.Identify(&bearer_old).status()));
  }
  absl::StatusOr<std::string> stored = storage.Get("auth/a");
  ASSERT_TRUE(stored.ok());
  EXPECT_THAT(*stored, Not(HasSubstr(a)));
  EXPECT_EQ(stored->size(), 32u);  // SHA-256

  Authenticator restarted(&storage, "admin-secret");
  ASSERT_TRUE(restarted.LoadFromStorage().ok());
  const std::string bearer_a = Bearer(a);
  absl::StatusOr<Caller> caller = restarted.Identify(&bearer_a);
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_EQ(caller->job_id, "a");
}

TEST(AuthenticatorTest, AForgottenJobsTokenAuthenticatesNothingEvenAfterARestart) {
  InMemoryStorage storage;
  Authenticator auth(&storage, "admin-secret");
  const std::string a = Bearer(*auth.IssueToken("a"));
  const std::string b = Bearer(*auth.IssueToken("b"));
  ASSERT_TRUE(auth.Forget("a").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(auth.Identify(&a).status()));
  EXPECT_EQ(auth.Identify(&b)->job_id, "b") << "other jobs keep theirs";
  EXPECT_EQ(auth.JobsWithTokens(), std::vector<std::string>{"b"});
  EXPECT_TRUE(absl::IsNotFound(storage.Get("auth/a").status()));
  EXPECT_TRUE(auth.Forget("never-had-one").ok());

  Authenticator restarted(&storage, "admin-secret");
  ASSERT_TRUE(restarted.LoadFromStorage().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(restarted.Identify(&a).status()));
  EXPECT_TRUE(restarted.Identify(&b).ok());
}

TEST(AuthenticatorTest, AdminTokenSettingsAreChecked) {
  EXPECT_EQ(*AdminToken("none", ""), "");
  EXPECT_TRUE(absl::IsInvalidArgument(AdminToken("token", "").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(AdminToken("none", "/x").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(AdminToken("oauth", "").status()));
  EXPECT_TRUE(absl::IsNotFound(AdminToken("token", "/nonexistent").status()));
}

}  // namespace
}  // namespace gradsync
