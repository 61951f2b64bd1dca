// gradsync._C's part for a Python process that is a member of a job by
// itself (gradsync:// outside `gradsync launch`, gradsync/member.py): the
// join, heartbeats and completion are gradsync's C++ client and
// HealthReporter, the ones gradsync-worker runs on.
#ifndef GRADSYNC_PYTHON_EXT_MEMBERSHIP_H_
#define GRADSYNC_PYTHON_EXT_MEMBERSHIP_H_

#include <pybind11/pybind11.h>

namespace gradsync {

// Adds Membership to `module`.
void RegisterMembership(pybind11::module_& module);

}  // namespace gradsync

#endif  // GRADSYNC_PYTHON_EXT_MEMBERSHIP_H_
