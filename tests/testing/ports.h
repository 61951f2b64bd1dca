// Loopback port helpers shared by the tests.
#ifndef GRADSYNC_TESTS_TESTING_PORTS_H_
#define GRADSYNC_TESTS_TESTING_PORTS_H_

namespace gradsync {

// A 127.0.0.1 port that nothing listens on at the time of the call (the
// kernel's choice for a socket bound to port 0, then closed). Fails the
// current test if no socket can be bound.
int PickUnusedPort();

}  // namespace gradsync

#endif  // GRADSYNC_TESTS_TESTING_PORTS_H_
