"""Python stacks for the coordinator's hang diagnosis: faulthandler, on a
signal, appends every thread's stack to a file whose first line is
"gradsync-stacks pid=PID", which the C++ side (worker/launch/
process_stacks.h) checks before it signals and parses after. Used by
gradsync.torch.monitor (the launch agent's file and signal) and
gradsync.elastic (a file of its own, its runtime's signal)."""
import faulthandler
import os


def register(path, signum):
    """Registers faulthandler on `signum` to append every thread's stack to
    the file at `path`, then writes the registration line (last: a process
    is signalled only once it has one; the signal would end a process that
    has not registered). Returns the open file, which must stay open while
    the registration lasts (faulthandler writes to its descriptor)."""
    stacks = open(path, "a", encoding="utf-8")
    faulthandler.register(signum, file=stacks, all_threads=True, chain=False)
    stacks.write(f"gradsync-stacks pid={os.getpid()}\n")
    stacks.flush()
    return stacks
