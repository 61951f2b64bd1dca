#include "python/ext/key_value.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/gradsync/v1/kv.pb.h"
#include "worker/client/grpc_coordinator_client.h"

namespace py = pybind11;

namespace gradsync {
namespace {

// Raises gradsync.client.Error(code, "WHAT: message"): the error the
// python3-grpcio KeyValue raises, so that callers handle one type.
[[noreturn]] void RaiseError(const char* what, const absl::Status& status) {
  py::object error = py::module_::import("gradsync.client").attr("Error");
  py::object instance =
      error(absl::StatusCodeToString(status.code()),
            std::string(what) + ": " + std::string(status.message()));
  PyErr_SetObject(error.ptr(), instance.ptr());
  throw py::error_already_set();
}

// `result`'s value, or gradsync.client.Error.
template <typename T>
T ValueOr(const char* what, absl::StatusOr<T> result) {
  if (!result.ok()) RaiseError(what, result.status());
  return *std::move(result);
}

void Check(const char* what, const absl::Status& status) {
  if (!status.ok()) RaiseError(what, status);
}

// The key-value store of one round of a job, with the calls and answers of
// gradsync.client.KeyValue (which see). Every call releases the GIL while it
// waits. Thread-safe; holds the client it was made from.
class KeyValue {
 public:
  KeyValue(std::shared_ptr<CoordinatorClient> client, const std::string& job,
           int64_t round)
      : client_(std::move(client)) {
    scope_.set_job_id(job);
    scope_.set_round(round);
  }

  void Set(const std::string& key, const std::string& value) {
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = client_->Set(scope_, key, value);
    }
    Check("set", status);
  }

  py::bytes Get(const std::string& key) {
    absl::StatusOr<std::string> value;
    {
      py::gil_scoped_release unlocked;
      value = client_->Get(scope_, key);
    }
    return py::bytes(ValueOr("get", std::move(value)));
  }

  int64_t Add(const std::string& key, int64_t delta) {
    absl::StatusOr<int64_t> sum;
    {
      py::gil_scoped_release unlocked;
      sum = client_->Add(scope_, key, delta);
    }
    return ValueOr("add", std::move(sum));
  }

  // (swapped, the value now stored or None when absent); `expected` None
  // stands for an absent key.
  std::pair<bool, std::optional<py::bytes>> CompareAndSet(
      const std::string& key, const std::optional<std::string>& expected,
      const std::string& desired) {
    v1::CompareAndSetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    request.set_expect_absent(!expected.has_value());
    request.set_expected(expected.value_or(""));
    request.set_desired(desired);
    absl::StatusOr<v1::CompareAndSetResponse> response;
    {
      py::gil_scoped_release unlocked;
      response = client_->CompareAndSet(request);
    }
    v1::CompareAndSetResponse answer =
        ValueOr("compare_and_set", std::move(response));
    if (!answer.exists()) return {answer.swapped(), std::nullopt};
    return {answer.swapped(), py::bytes(answer.value())};
  }

  void Wait(const std::vector<std::string>& keys, double timeout_seconds) {
    // The coordinator takes whole milliseconds; at least one.
    const absl::Duration timeout =
        std::max(absl::Milliseconds(1), absl::Seconds(timeout_seconds));
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = client_->Wait(scope_, keys, timeout);
    }
    Check("wait", status);
  }

  bool Delete(const std::string& key) {
    absl::StatusOr<bool> existed;
    {
      py::gil_scoped_release unlocked;
      existed = client_->Delete(scope_, key);
    }
    return ValueOr("delete", std::move(existed));
  }

  std::vector<std::string> Keys(const std::string& prefix) {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> entries;
    {
      py::gil_scoped_release unlocked;
      entries = client_->List(scope_, prefix, /*keys_only=*/true);
    }
    std::vector<std::string> keys;
    for (auto& entry : ValueOr("list", std::move(entries))) {
      keys.push_back(std::move(entry.first));
    }
    return keys;
  }

 private:
  const std::shared_ptr<CoordinatorClient> client_;
  v1::Scope scope_;
};

// A connection to a coordinator (gradsync.Client's target, timeout, token
// and TLS files), retrying UNAVAILABLE calls for up to a minute as
// gradsync.client does. Thread-safe.
class Client {
 public:
  Client(const std::string& target, double timeout_seconds,
         const std::string& token, const std::string& tls_ca,
         const std::string& tls_cert, const std::string& tls_key) {
    ClientOptions options;
    options.target = target;
    options.call_timeout = absl::Seconds(timeout_seconds);
    options.token = token;
    options.tls = {tls_ca, tls_cert, tls_key};
    absl::StatusOr<std::unique_ptr<CoordinatorClient>> client =
        GrpcCoordinatorClient::Create(std::move(options));
    if (!client.ok()) {
      throw std::invalid_argument("gradsync client: " +
                                  client.status().ToString());
    }
    client_ = *std::move(client);
  }

  KeyValue Kv(const std::string& job, int64_t round) const {
    return KeyValue(client_, job, round);
  }

 private:
  std::shared_ptr<CoordinatorClient> client_;
};

}  // namespace

void RegisterKeyValue(py::module_& m) {
  py::class_<KeyValue>(m, "KeyValue",
                       "The key-value store of one round of a job (as "
                       "gradsync.client.KeyValue), through the C++ client.")
      .def("set", &KeyValue::Set, py::arg("key"), py::arg("value"))
      .def("get", &KeyValue::Get, py::arg("key"))
      .def("add", &KeyValue::Add, py::arg("key"), py::arg("delta"))
      .def("compare_and_set", &KeyValue::CompareAndSet, py::arg("key"),
           py::arg("expected"), py::arg("desired"))
      .def("wait", &KeyValue::Wait, py::arg("keys"), py::arg("timeout"))
      .def("delete", &KeyValue::Delete, py::arg("key"))
      .def("keys", &KeyValue::Keys, py::arg("prefix") = "");
  py::class_<Client>(m, "Client",
                     "A connection to a coordinator for key-value calls "
                     "(gradsync.torch.Store's).")
      .def(py::init<const std::string&, double, const std::string&,
                    const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("target"), py::arg("timeout"), py::arg("token") = "",
           py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "")
      .def("kv", &Client::Kv, py::arg("job_id"), py::arg("round"));
}

}  // namespace gradsync
