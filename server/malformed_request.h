// The answer to a request whose bytes do not parse as the method's request
// message: INVALID_ARGUMENT naming the method and the message type, on
// every method. gRPC's own answers are unhelpful and differ by API:
// UNIMPLEMENTED with no message (callback API), INTERNAL "Unable to parse
// request" (asynchronous API), neither of which a client can act on.
#ifndef GRADSYNC_SERVER_MALFORMED_REQUEST_H_
#define GRADSYNC_SERVER_MALFORMED_REQUEST_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "absl/strings/string_view.h"

namespace gradsync {

// INVALID_ARGUMENT: "the request to METHOD is not a valid TYPE message (its
// bytes do not parse)". `method` is gRPC's "/package.Service/Method"; TYPE
// comes from the generated descriptors (omitted for an unknown method).
grpc::Status MalformedRequest(absl::string_view method);

// An interceptor factory (for ServerBuilder::experimental()
// .SetInterceptorCreators, placed first) that answers MalformedRequest()
// for a unary or server-streaming call whose request did not parse, in
// place of the status the call would otherwise end with. Calls served with
// the asynchronous API never reach interceptors with such a request: they
// parse their requests themselves (PendingCall). Thread-safe.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewMalformedRequestInterceptorFactory();

}  // namespace gradsync

#endif  // GRADSYNC_SERVER_MALFORMED_REQUEST_H_
