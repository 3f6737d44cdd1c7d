//! Landlock rulesets.

use super::{check, owned, SysResult};
use libc::{c_int, c_uint};
use std::os::fd::OwnedFd;

/// `struct landlock_ruleset_attr` as of Landlock ABI 6 (the kernel accepts a larger struct than
/// it knows as long as the fields it does not know are zero, so one layout serves every ABI).
#[repr(C)]
pub struct LandlockRulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's header too: 12 bytes).
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct landlock_net_port_attr` (16 bytes, not packed).
#[repr(C)]
struct LandlockNetPortAttr {
    allowed_access: u64,
    port: u64,
}

const LANDLOCK_CREATE_RULESET_VERSION: c_uint = 1;
const LANDLOCK_RULE_PATH_BENEATH: c_int = 1;
const LANDLOCK_RULE_NET_PORT: c_int = 2;

/// The kernel's Landlock ABI version: `landlock_create_ruleset(NULL, 0, VERSION)`. `ENOSYS` when
/// the kernel was built without Landlock, `EOPNOTSUPP` when it is built in but not enabled at boot.
pub fn landlock_abi() -> SysResult<u32> {
    // SAFETY: with the VERSION flag the kernel requires a NULL attribute and size 0, and reads
    // nothing; it only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<LandlockRulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    check(r).map(|v| v as u32)
}

/// `landlock_create_ruleset(attr, sizeof attr, 0)`: a new ruleset descriptor (close-on-exec).
pub fn landlock_create_ruleset(attr: &LandlockRulesetAttr) -> SysResult<OwnedFd> {
    // SAFETY: `attr` is a live, fully initialized struct and the size passed is its own, so the
    // kernel reads exactly the bytes we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            attr as *const LandlockRulesetAttr,
            std::mem::size_of::<LandlockRulesetAttr>(),
            0 as c_uint,
        )
    };
    owned(r)
}

/// `landlock_add_rule(ruleset, PATH_BENEATH, {access, parent}, 0)`: `access` under the file or
/// directory `parent` is open on (an `O_PATH` descriptor is enough).
pub fn landlock_add_path_rule(ruleset: c_int, parent: c_int, access: u64) -> SysResult<()> {
    let attr = LandlockPathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: `attr` lives on this stack frame for the whole call and has the packed layout the
    // kernel copies for PATH_BENEATH rules; the kernel does not keep the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneathAttr,
            0 as c_uint,
        )
    };
    check(r).map(drop)
}

/// `landlock_add_rule(ruleset, NET_PORT, {access, port}, 0)`: `access` (TCP bind, connect) on
/// `port`, whatever the address (Landlock ABI 4).
pub fn landlock_add_port_rule(ruleset: c_int, port: u16, access: u64) -> SysResult<()> {
    let attr = LandlockNetPortAttr {
        allowed_access: access,
        port: u64::from(port),
    };
    // SAFETY: `attr` lives on this stack frame for the whole call and has the layout the kernel
    // copies for NET_PORT rules; the kernel does not keep the pointer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset,
            LANDLOCK_RULE_NET_PORT,
            &attr as *const LandlockNetPortAttr,
            0 as c_uint,
        )
    };
    check(r).map(drop)
}

/// `landlock_restrict_self(ruleset, 0)`: the calling thread (and everything it starts from now on)
/// enters the ruleset's domain, for good. Needs no_new_privs or `CAP_SYS_ADMIN` in its user
/// namespace.
pub fn landlock_restrict_self(ruleset: c_int) -> SysResult<()> {
    // SAFETY: integer arguments only; the call changes this thread's own credentials.
    check(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as c_uint) })
        .map(drop)
}
