//! Threads kept for reuse by the library's per-run work: each run's supervising thread and its
//! DNS stub's.
//!
//! Starting a thread and ending it again cost ~50 µs of CPU on this project's 2-vCPU VM (its
//! stack and signal stack mapped, guarded and unmapped, each unmap a TLB shootdown across the
//! process's CPUs), twice a run. A [`Pool`] keeps a thread that finished its work for the next
//! one instead: at most [`MAX_IDLE`] a pool, each for at most [`IDLE_FOR`], after which it ends.
//!
//! A job runs with the signal mask of the thread that spawned it, as a new thread would (a caller
//! that blocks `SIGINT` to take it from a signalfd, say). What else a job may leave on its thread
//! is kept to the next job, so the callers' work leaves nothing: they restore a signal mask or an
//! identity they change (with guards that also run while a panic unwinds), and measure their CPU
//! as differences; a thread whose ids are not the ones its job started with afterwards ends. Other
//! attributes a thread passes to what it starts (its CPU affinity and nice value, a seccomp filter
//! or Landlock domain of its own) are those of the thread that made the pooled thread. A job that
//! panics ends its thread instead of returning it, whatever it left. In a process forked from
//! one with waiting threads, the pool starts empty (those threads are not there).
//!
//! A thread is named [`IDLE_NAME`] from the end of its job (before the job's [`Handle`] says so)
//! until its next, when it takes its pool's name again: a count of a process's `palisade-*`
//! threads by name tells waiting ones from working ones.

use crate::sys;
use std::any::Any;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// At most this many threads of one pool wait for work; a thread that finds the pool full ends.
pub const MAX_IDLE: usize = 32;
/// A waiting thread ends after this long without work.
pub const IDLE_FOR: Duration = Duration::from_secs(5);
/// The name of a thread waiting in a pool.
pub const IDLE_NAME: &str = "palisade-idle";

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Threads of one name, kept for reuse. A `static`: `Pool::new` is `const`.
pub struct Pool {
    name: &'static CStr,
    idle: Mutex<Vec<Arc<Slot>>>,
    /// The process whose threads `idle` names (a forked child has none of them).
    pid: AtomicU32,
}

/// Where a waiting thread is handed its next job.
struct Slot {
    job: Mutex<Option<Job>>,
    ready: Condvar,
}

/// Waits for a job's end, as [`std::thread::JoinHandle`] waits for a thread's.
pub struct Handle {
    done: Arc<Done>,
}

struct Done {
    result: Mutex<Option<Result<(), Box<dyn Any + Send>>>>,
    ended: Condvar,
}

impl Pool {
    /// A pool whose threads are named `name` (at most 15 bytes, as the kernel keeps).
    pub const fn new(name: &'static CStr) -> Pool {
        Pool {
            name,
            idle: Mutex::new(Vec::new()),
            pid: AtomicU32::new(0),
        }
    }

    /// Runs `f` on a waiting thread of the pool, or on a new one. The closure and everything it
    /// captured are dropped before [`Handle::join`] returns, as with a thread's end.
    pub fn spawn<F>(&'static self, f: F) -> std::io::Result<Handle>
    where
        F: FnOnce() + Send + 'static,
    {
        let done = Arc::new(Done {
            result: Mutex::new(None),
            ended: Condvar::new(),
        });
        let d = done.clone();
        let mask = sys::thread_mask();
        let job: Job = Box::new(move || {
            sys::thread_set_mask(&mask);
            let ids = sys::thread_ids();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let panicked = r.is_err();
            if !panicked {
                // Named as waiting before its end is told: whoever waits for the job and then
                // counts threads by name sees this one as a waiting one.
                sys::set_thread_name(c"palisade-idle");
            }
            *d.result.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            d.ended.notify_all();
            if panicked || sys::thread_ids() != ids {
                // What the job left on its thread is unknown, or not what it found: the thread
                // ends (see `work`).
                std::panic::resume_unwind(Box::new("a pooled job panicked or kept other ids"));
            }
        });
        let waiting = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let me = std::process::id();
            if self.pid.swap(me, Ordering::Relaxed) != me {
                // Made in the process this one was forked from: not threads of this one.
                idle.clear();
            }
            idle.pop()
        };
        match waiting {
            Some(slot) => {
                *slot.job.lock().unwrap_or_else(|p| p.into_inner()) = Some(job);
                slot.ready.notify_one();
            }
            None => {
                let name = self.name.to_string_lossy().into_owned();
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || self.work(job))?;
            }
        }
        Ok(Handle { done })
    }

    /// A thread's life: its first job, then the jobs it is handed while it waits in the pool.
    fn work(&'static self, first: Job) {
        let mut job = first;
        loop {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                return;
            }
            let slot = Arc::new(Slot {
                job: Mutex::new(None),
                ready: Condvar::new(),
            });
            {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                if idle.len() >= MAX_IDLE {
                    return;
                }
                idle.push(slot.clone());
            }
            match self.wait(&slot) {
                Some(next) => {
                    sys::set_thread_name(self.name);
                    job = next;
                }
                None => return,
            }
        }
    }

    /// Waits in the pool for a job; `None` once [`IDLE_FOR`] has passed without one and the
    /// thread has left the pool.
    fn wait(&self, slot: &Arc<Slot>) -> Option<Job> {
        let end = Instant::now() + IDLE_FOR;
        let mut job = slot.job.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(j) = job.take() {
                return Some(j);
            }
            let now = Instant::now();
            if now >= end {
                // Leave the pool, unless a spawner has just taken this thread from it: then its
                // job is on its way, and is waited for.
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = idle.iter().position(|s| Arc::ptr_eq(s, slot)) {
                    idle.swap_remove(i);
                    return None;
                }
                drop(idle);
                while job.is_none() {
                    job = slot.ready.wait(job).unwrap_or_else(|p| p.into_inner());
                }
                continue;
            }
            job = slot
                .ready
                .wait_timeout(job, end - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Handle {
    /// Waits for the job's end: `Err` with the panic's payload if it panicked.
    pub fn join(self) -> Result<(), Box<dyn Any + Send>> {
        let mut r = self.done.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = r.take() {
                return r;
            }
            r = self.done.ended.wait(r).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether the job has ended.
    pub fn is_finished(&self) -> bool {
        self.done
            .result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
            .map(|c| c.trim().to_owned())
            .collect()
    }

    /// Waits until a thread of `p` waits in it (a finished job's thread goes back very soon after
    /// its end is told).
    fn wait_idle(p: &Pool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.idle.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the thread never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn tid() -> String {
        std::fs::read_link("/proc/thread-self")
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_finished_thread_takes_the_next_job() {
        static P: Pool = Pool::new(c"palisade-t1");
        let first = Arc::new(Mutex::new(String::new()));
        let f = first.clone();
        P.spawn(move || *f.lock().unwrap() = tid())
            .unwrap()
            .join()
            .unwrap();
        wait_idle(&P);
        assert!(names().iter().any(|n| n == IDLE_NAME));
        let second = Arc::new(Mutex::new((String::new(), String::new())));
        let s = second.clone();
        P.spawn(move || {
            let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
            *s.lock().unwrap() = (tid(), name.trim().to_owned());
        })
        .unwrap()
        .join()
        .unwrap();
        let (t2, name) = second.lock().unwrap().clone();
        assert_eq!(t2, *first.lock().unwrap(), "a new thread was started");
        assert_eq!(name, "palisade-t1", "the job ran under the idle name");
    }

    #[test]
    fn a_job_is_dropped_before_join_returns() {
        static P: Pool = Pool::new(c"palisade-t2");
        struct Flag(Arc<AtomicUsize>);
        impl Drop for Flag {
            fn drop(&mut self) {
                std::thread::sleep(Duration::from_millis(20));
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let n = Arc::new(AtomicUsize::new(0));
        for _ in 0..20 {
            let flag = Flag(n.clone());
            let before = n.load(Ordering::SeqCst);
            // Held by the closure, which drops it when its thread is done with it.
            P.spawn(move || {
                let _held = &flag;
            })
            .unwrap()
            .join()
            .unwrap();
            assert_eq!(n.load(Ordering::SeqCst), before + 1);
        }
    }

    #[test]
    fn a_panicking_job_ends_its_thread_and_is_reported() {
        static P: Pool = Pool::new(c"palisade-t3");
        let t = Arc::new(Mutex::new(String::new()));
        let t1 = t.clone();
        let r = P
            .spawn(move || {
                *t1.lock().unwrap() = tid();
                panic!("on purpose");
            })
            .unwrap()
            .join();
        assert!(r.is_err());
        // "PID/task/TID"
        let gone = t.lock().unwrap().clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{gone}")).exists() {
            assert!(
                Instant::now() < deadline,
                "the thread of a panicked job lived on"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(P.idle.lock().unwrap().is_empty());
    }

    #[test]
    fn at_most_max_idle_threads_wait() {
        static P: Pool = Pool::new(c"palisade-t4");
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let handles: Vec<Handle> = (0..MAX_IDLE + 8)
            .map(|_| {
                let g = gate.clone();
                P.spawn(move || {
                    let mut open = g.0.lock().unwrap();
                    while !*open {
                        open = g.1.wait(open).unwrap();
                    }
                })
                .unwrap()
            })
            .collect();
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        for h in handles {
            h.join().unwrap();
        }
        // Every thread goes back to the pool or ends (the pool is full): it fills up to its bound,
        // and no further.
        let deadline = Instant::now() + Duration::from_secs(4);
        while P.idle.lock().unwrap().len() < MAX_IDLE {
            assert!(Instant::now() < deadline, "the pool never filled");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(P.idle.lock().unwrap().len(), MAX_IDLE);
    }

    /// The thread's `SigBlk` mask, from /proc.
    fn blocked() -> u64 {
        let st = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let hex = st
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .unwrap()
            .trim();
        u64::from_str_radix(hex, 16).unwrap()
    }

    /// A job runs with the mask of the thread that spawned it, not the one of the thread that
    /// made the pooled thread: a caller that blocks a signal to take it from a signalfd must not
    /// have it delivered to a pooled thread that does not block it.
    #[test]
    fn a_job_runs_with_its_spawners_signal_mask() {
        static P: Pool = Pool::new(c"palisade-t5");
        let usr2 = 1u64 << (libc::SIGUSR2 - 1);
        let seen = Arc::new(Mutex::new(Vec::new()));
        for block in [false, true, false] {
            let s = seen.clone();
            std::thread::spawn(move || {
                if block {
                    sys::thread_block(&sys::SigSet::of(&[libc::SIGUSR2])).unwrap();
                }
                P.spawn(move || s.lock().unwrap().push((tid(), blocked() & usr2 != 0)))
                    .unwrap()
                    .join()
                    .unwrap();
            })
            .join()
            .unwrap();
            // Back in the pool before the next spawn.
            wait_idle(&P);
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|s| s.1).collect::<Vec<_>>(),
            [false, true, false]
        );
        assert!(
            seen.iter().all(|s| s.0 == seen[0].0),
            "not one thread: {seen:?}"
        );
    }

    /// In a forked child the waiting threads of the parent are not there: a job still runs.
    #[test]
    fn a_forked_child_starts_with_an_empty_pool() {
        static P: Pool = Pool::new(c"palisade-t6");
        P.spawn(|| {}).unwrap().join().unwrap();
        wait_idle(&P);
        #[allow(unsafe_code)]
        // SAFETY: the child uses the pool (glibc's fork leaves its allocator usable), then exits;
        // the parent gives up on it after a while rather than hang.
        let pid = unsafe { sys::fork() }.unwrap();
        if pid == 0 {
            let (tx, rx) = std::sync::mpsc::channel();
            let ok = P.spawn(move || tx.send(()).unwrap()).is_ok();
            let ran = ok && rx.recv_timeout(Duration::from_secs(10)).is_ok();
            sys::exit(if ran { 0 } else { 1 });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let st = loop {
            match sys::waitpid(pid, libc::WNOHANG).unwrap() {
                (0, _) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                (0, _) => {
                    let _ = sys::kill(pid, libc::SIGKILL);
                    let _ = sys::waitpid(pid, 0);
                    panic!("the child never ended");
                }
                (_, st) => break st,
            }
        };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the job never ran in the child: {st:#x}"
        );
    }
}
