//! Starting a task's process without copying its launcher. The standard
//! library `fork`s as soon as anything must happen between fork and `exec`
//! (here: joining the task's cgroup), and a fork copies every page table of
//! a large, multi-threaded launcher only for `exec` to throw them away.
//! This is what `posix_spawn` does instead: a `vfork`-like clone whose child
//! borrows the parent's memory and runs a few async-signal-safe calls
//! (cgroup, process group, signals, descriptors, directory) before `exec`,
//! while the calling thread waits.
//!
//! The child starts in the task's cgroup where the kernel can do that
//! (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7). Moving a running process
//! there instead (a write to `cgroup.procs`) takes the kernel's cgroup
//! migration lock for writing, which waits for an RCU grace period: some
//! 10–20 ms per task when tasks start a few times a second, a delay every
//! short task would pay.

use std::{
    ffi::{CStr, CString, OsStr},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    ptr,
    sync::OnceLock,
    sync::atomic::{AtomicBool, AtomicI32, Ordering},
};

use nix::libc;

use crate::Entry;

/// What to start: `program` (a path, not searched for) with `argv` (its
/// first word included) and exactly `env`, in `cwd`.
#[derive(Debug)]
pub struct Spawn<'a> {
    pub program: &'a Path,
    pub argv: &'a [&'a OsStr],
    /// Each variable as the kernel takes it, `NAME=value`.
    pub env: &'a [&'a CStr],
    pub cwd: &'a Path,
    /// The cgroup the process starts in.
    pub cgroup: Option<&'a Entry>,
    /// Added to the calling thread's niceness for the process (0 or less:
    /// none added).
    pub nice: i32,
}

/// A started process, leader of its own process group, with its standard
/// input at `/dev/null` and the read ends of its stdout and stderr pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// A descriptor of the process, readable once it has exited, where
    /// the kernel made one as it started it (`clone3`).
    pub pidfd: Option<OwnedFd>,
}

/// The steps of the child, to say which failed.
const STEPS: [&str; 7] = [
    "join its cgroup",
    "make its process group",
    "set its standard streams",
    "enter its directory",
    "start the program",
    "prepare",
    "lower its priority",
];

/// Everything the child reads, made before the clone: it may not allocate.
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    procs: RawFd,
    streams: [RawFd; 3],
    /// The niceness the child takes, if not the parent's.
    nice: Option<libc::c_int>,
    /// Set by the child as it starts: one that did not was killed as it
    /// was born.
    started: AtomicBool,
    /// The kernel started the child with default signal handlers.
    handlers_cleared: bool,
    /// Set by a child that failed: the step (index in [`STEPS`]) and
    /// `errno`. The child shares this memory and the parent reads it only
    /// once the child has exited.
    failed: AtomicI32,
    errno: AtomicI32,
}

/// Starts the process; the error names the step that failed.
pub fn spawn(spec: &Spawn<'_>) -> io::Result<Spawned> {
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
    };
    let program = c(spec.program.as_os_str().as_bytes())?;
    let cwd = c(spec.cwd.as_os_str().as_bytes())?;
    let argv = spec
        .argv
        .iter()
        .map(|a| c(a.as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let pointers = |strings: &mut dyn Iterator<Item = &CStr>| {
        let mut list: Vec<*const libc::c_char> = strings.map(CStr::as_ptr).collect();
        list.push(ptr::null());
        list
    };
    let argv_ptrs = pointers(&mut argv.iter().map(CString::as_c_str));
    let envp_ptrs = pointers(&mut spec.env.iter().copied());
    let null = dev_null()?;
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let mut args = ChildArgs {
        program: program.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        cwd: cwd.as_ptr(),
        procs: -1,
        streams: [null, out_write.as_raw_fd(), err_write.as_raw_fd()],
        nice: niceness(spec.nice)?,
        started: AtomicBool::new(false),
        handlers_cleared: cfg!(target_arch = "x86_64"),
        failed: AtomicI32::new(-1),
        errno: AtomicI32::new(0),
    };
    let mut stack = STACK.take();
    stack.reserve_exact(STACK_BYTES);
    let mut pidfd = None;
    // SAFETY: the child runs `child` on its own stack and only reads
    // `args`, which outlive the call: with CLONE_VFORK this thread resumes
    // only once the child has called `exec` or exited. Every signal is
    // blocked meanwhile, so that no handler of the parent's runs in the
    // child before `child` resets them.
    let (pid, error) = unsafe {
        let base = stack.as_mut_ptr();
        let top = base.add(stack.capacity());
        let top = top.sub(top as usize % 16);
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let cloned = clone3_child(
            spec.cgroup.map(Entry::dir_fd),
            (base, top.offset_from(base) as usize),
            ptr::from_ref(&args).cast_mut().cast(),
            &mut pidfd,
        )
        .and_then(|pid| {
            if !args.started.load(Ordering::Acquire) {
                pidfd = None;
                // Killed before it ran a thing: some kernels kill a child
                // born into a cgroup whose count of `cgroup.kill`s differs
                // from its parent's. The child moves itself from now on.
                libc::waitpid(pid, ptr::null_mut(), 0);
                NO_CLONE3.store(true, Ordering::Relaxed);
                tracing::warn!(
                    "children born in a cgroup are killed: tasks move into theirs instead"
                );
                return None;
            }
            Some(pid)
        });
        let pid = match cloned {
            Some(pid) => pid,
            None => {
                // The child joins its cgroup itself, and resets handlers.
                args.procs = spec.cgroup.map_or(-1, Entry::fd);
                args.handlers_cleared = false;
                libc::clone(
                    child,
                    top.cast(),
                    libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                    ptr::from_ref(&args).cast_mut().cast(),
                )
            }
        };
        let error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        (pid, error)
    };
    STACK.set(stack);
    if pid < 0 {
        return Err(error);
    }
    drop((out_write, err_write));
    let step = args.failed.load(Ordering::Acquire);
    if step >= 0 {
        // SAFETY: reaps the child we made, which has exited.
        unsafe { libc::waitpid(pid, ptr::null_mut(), 0) };
        let error = io::Error::from_raw_os_error(args.errno.load(Ordering::Acquire));
        let step = STEPS.get(step as usize).unwrap_or(&"start");
        return Err(io::Error::new(
            error.kind(),
            format!("cannot {step}: {error}"),
        ));
    }
    Ok(Spawned {
        pid,
        stdout: out_read,
        stderr: err_read,
        pidfd,
    })
}

/// Enough for the few calls the child makes before `exec`.
const STACK_BYTES: usize = 64 << 10;

thread_local! {
    /// The children's stack (its capacity; never read before a child
    /// writes it), kept from one to the next: the calling thread waits
    /// while a child uses it, and freeing so large a block makes the
    /// allocator consolidate its free lists.
    static STACK: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// The child starts with every caught signal at its default (Linux 5.5).
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

/// Set once the kernel has said it has no `clone3` (into a cgroup).
static NO_CLONE3: AtomicBool = AtomicBool::new(false);

#[cfg(test)]
thread_local! {
    /// A test's child moves into its cgroup, as on a kernel that cannot
    /// start it there (per thread: tests run side by side).
    static MOVE_INTO_CGROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn told_to_move() -> bool {
    #[cfg(test)]
    return MOVE_INTO_CGROUP.with(std::cell::Cell::get);
    #[cfg(not(test))]
    false
}

/// Starts [`child`] on `stack` (base and size), in the cgroup open as
/// `cgroup` if any, as [`libc::clone`] would start it, but with no handler
/// of the parent's, and a pidfd of it in `pidfd`: its pid, or `None` where
/// the kernel cannot, for the caller to start it otherwise.
///
/// # Safety
/// As for `libc::clone` with `CLONE_VM | CLONE_VFORK`: `arg` and `stack`
/// outlive the child's `exec`, and every signal is blocked.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_child(
    cgroup: Option<RawFd>,
    (stack, size): (*mut u8, usize),
    arg: *mut libc::c_void,
    pidfd: &mut Option<OwnedFd>,
) -> Option<libc::pid_t> {
    if NO_CLONE3.load(Ordering::Relaxed) || told_to_move() {
        return None;
    }
    let into_cgroup = match cgroup {
        Some(_) => CLONE_INTO_CGROUP,
        None => 0,
    };
    let mut fd: libc::c_int = -1;
    let args = libc::clone_args {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64
            | into_cgroup
            | CLONE_CLEAR_SIGHAND,
        pidfd: &raw mut fd as u64,
        child_tid: 0,
        parent_tid: 0,
        exit_signal: libc::SIGCHLD as u64,
        stack: stack as u64,
        stack_size: size as u64,
        tls: 0,
        set_tid: 0,
        set_tid_size: 0,
        cgroup: cgroup.map_or(0, |fd| fd as u64),
    };
    let entry: extern "C" fn(*mut libc::c_void) -> libc::c_int = child;
    let returned: i64;
    // SAFETY: the raw `clone3` system call. The parent gets the child's pid
    // or `-errno` and goes on. The child starts on the top of `stack`
    // (16-byte aligned, so `call` leaves it as a function expects) with the
    // parent's registers: it calls `child(arg)` from the two registers the
    // kernel preserves, and exits with what it returns (it never does: it
    // `exec`s or `_exit`s). `arg` and `stack` outlive the child's `exec`,
    // the caller's promise, since CLONE_VFORK holds this thread until then.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r12",
            "call r13",
            "mov edi, eax",
            "mov eax, 231", // exit_group
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => returned,
            in("rdi") &args as *const libc::clone_args,
            in("rsi") std::mem::size_of::<libc::clone_args>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    match returned {
        pid if pid >= 0 => {
            // SAFETY: the kernel made this descriptor for us alone.
            *pidfd = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
            Some(pid as libc::pid_t)
        }
        // No `clone3`, none with a cgroup, or one a seccomp filter forbids:
        // never again.
        e if [libc::ENOSYS, libc::E2BIG, libc::EPERM].contains(&(-e as i32)) => {
            NO_CLONE3.store(true, Ordering::Relaxed);
            None
        }
        // Anything else (a cgroup the kernel refuses to start a process
        // in, say): the child tries to join it itself, and says why not.
        _ => None,
    }
}

/// Elsewhere, the child always joins its cgroup itself.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_child(
    _cgroup: Option<RawFd>,
    _stack: (*mut u8, usize),
    _arg: *mut libc::c_void,
    _pidfd: &mut Option<OwnedFd>,
) -> Option<libc::pid_t> {
    None
}

/// The child, between clone and `exec`: async-signal-safe calls only, on
/// memory the parent prepared.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive until this child has
    // called `exec` or exited; only plain system calls follow.
    unsafe {
        let args = &*(arg as *const ChildArgs);
        args.started.store(true, Ordering::Release);
        let fail = |step: i32| fail(args, step);
        // "0": the writing process itself.
        if args.procs >= 0 && libc::write(args.procs, b"0".as_ptr().cast(), 1) != 1 {
            fail(0);
        }
        if libc::setpgid(0, 0) != 0 {
            fail(1);
        }
        // No handler of the parent's may run here once signals are
        // unblocked (one would act in the parent's memory): each caught
        // signal goes back to its default, unless the kernel did that
        // (CLONE_CLEAR_SIGHAND). SIGPIPE, which the Rust runtime ignores,
        // is reset as the standard library does, so that `yes | head`
        // ends. Then none is blocked.
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        if !args.handlers_cleared {
            for signal in 1..=64 {
                let mut current: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, ptr::null(), &mut current) == 0
                    && current.sa_sigaction != libc::SIG_DFL
                    && current.sa_sigaction != libc::SIG_IGN
                {
                    libc::sigaction(signal, &default, ptr::null_mut());
                }
            }
        }
        libc::sigaction(libc::SIGPIPE, &default, ptr::null_mut());
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::sigprocmask(libc::SIG_SETMASK, &none, ptr::null_mut()) != 0 {
            fail(5);
        }
        // Each above 2 (see `above_stdio`): none is overwritten before it is moved.
        for (target, &fd) in args.streams.iter().enumerate() {
            if libc::dup2(fd, target as RawFd) < 0 {
                fail(2);
            }
        }
        if libc::chdir(args.cwd) != 0 {
            fail(3);
        }
        if let Some(nice) = args.nice
            && libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0
        {
            fail(6);
        }
        libc::execve(args.program, args.argv, args.envp);
        fail(4)
    }
}

/// The shortest slice the kernel grants a thread (Linux 6.12): 0.1 ms.
const SHORTEST_SLICE_NS: u64 = 100_000;

/// Asks the scheduler to run the calling thread soon after it wakes, in
/// return for running it in short slices: a thread that starts processes
/// for others is woken by each end and works briefly, and what it serves
/// waits while it queues behind them. The thread keeps its policy and
/// niceness; a thread not under the fair scheduler's normal or batch
/// policy is left as it is. Kernels before 6.12 ignore the slice, not the
/// rest: what the thread starts begins with the default attributes
/// (`SCHED_FLAG_RESET_ON_FORK`: a negative niceness back at 0).
pub fn prompt_wakeups() -> io::Result<()> {
    let size = std::mem::size_of::<libc::sched_attr>() as u32;
    let mut attr = libc::sched_attr {
        size,
        sched_policy: 0,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: 0,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: `sched_getattr` of the calling thread (0) fills `attr`, no
    // more than `size` bytes of it.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) };
    if got != 0 {
        return Err(io::Error::last_os_error());
    }
    if ![libc::SCHED_OTHER, libc::SCHED_BATCH].contains(&(attr.sched_policy as libc::c_int)) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "not under the fair scheduler's normal or batch policy",
        ));
    }
    attr.size = size;
    attr.sched_flags |= libc::SCHED_FLAG_RESET_ON_FORK as u64;
    attr.sched_runtime = SHORTEST_SLICE_NS;
    // SAFETY: `sched_setattr` of the calling thread (0) reads `attr`.
    let set = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The niceness a child `more` nicer than this thread takes (at most 19,
/// the least favoured), `None` for none nicer: a child may not run ahead
/// of the thread that starts it.
fn niceness(more: i32) -> io::Result<Option<libc::c_int>> {
    if more <= 0 {
        return Ok(None);
    }
    // SAFETY: plain system calls; `getpriority` may return -1 as a
    // niceness, so errno says whether it failed.
    let own = unsafe {
        *libc::__errno_location() = 0;
        let own = libc::getpriority(libc::PRIO_PROCESS, 0);
        if own == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        own
    };
    Ok(Some(own.saturating_add(more).clamp(-20, 19)))
}

/// Tells the parent which step failed and why, and exits.
///
/// # Safety
/// For the child only, on the parent's `args`.
unsafe fn fail(args: &ChildArgs, step: i32) -> ! {
    // SAFETY: `errno` is this thread's (the parent's, which waits), and
    // `_exit` ends the child without running anything of the parent's.
    unsafe {
        args.errno
            .store(*libc::__errno_location(), Ordering::Release);
        args.failed.store(step, Ordering::Release);
        libc::_exit(127)
    }
}

/// A close-on-exec pipe, both ends above the standard streams.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `pipe2` fills both descriptors, which we then own.
    let (read, write) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// The same descriptor numbered 3 or more (close-on-exec): where a
/// launcher's own standard streams are closed, a new descriptor could be
/// 0, 1 or 2, and the child's `dup2`s would overwrite one before moving it.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: duplicates a descriptor we own into a new one we then own.
    unsafe {
        let moved = libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3);
        if moved < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(moved))
    }
}

/// `/dev/null`, opened once for every child's standard input.
fn dev_null() -> io::Result<RawFd> {
    static NULL: OnceLock<Option<OwnedFd>> = OnceLock::new();
    NULL.get_or_init(|| {
        std::fs::File::open("/dev/null")
            .ok()
            .and_then(|file| above_stdio(OwnedFd::from(file)).ok())
    })
    .as_ref()
    .map(AsRawFd::as_raw_fd)
    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "cannot open /dev/null"))
}

#[cfg(test)]
mod tests;
