//! Privileges: whether sysprof may load BPF programs, and who the user behind `sudo` is (they
//! own the output files and run `-- CMD`).

use std::{ffi::CString, path::Path};

use nix::unistd::{Gid, Uid, User};

/// CAP_PERFMON and CAP_BPF (Linux 5.8+), bits of the CapEff mask in /proc/self/status.
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
/// CAP_SYS_ADMIN covers both on kernels that predate them.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether this process may load and attach tracing BPF programs.
pub fn can_trace() -> bool {
    if Uid::effective().is_root() {
        return true;
    }
    let Some(caps) = effective_capabilities() else {
        return false;
    };
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|line| line.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The user who ran `sudo sysprof ...`, from the variables sudo sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvokingUser {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    pub home: String,
    /// Supplementary groups, so `-- CMD` keeps access granted by group (video, render, ...).
    pub groups: Vec<u32>,
}

impl InvokingUser {
    /// The user behind sudo, when sysprof runs as root through sudo for someone else.
    pub fn from_sudo_env() -> Option<Self> {
        if !Uid::effective().is_root() {
            return None;
        }
        let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
        if uid == 0 {
            return None;
        }
        let user = User::from_uid(Uid::from_raw(uid)).ok().flatten();
        let gid = std::env::var("SUDO_GID")
            .ok()
            .and_then(|gid| gid.parse().ok())
            .or_else(|| user.as_ref().map(|u| u.gid.as_raw()))?;
        let (name, home) = match &user {
            Some(user) => (user.name.clone(), user.dir.to_string_lossy().into_owned()),
            None => (std::env::var("SUDO_USER").unwrap_or_else(|_| uid.to_string()), "/".into()),
        };
        let groups = CString::new(name.clone())
            .ok()
            .and_then(|cname| nix::unistd::getgrouplist(&cname, Gid::from_raw(gid)).ok())
            .map(|groups| groups.into_iter().map(Gid::as_raw).collect())
            .unwrap_or_else(|| vec![gid]);
        Some(InvokingUser { uid, gid, name, home, groups })
    }

    /// Gives `path` to this user, so results written by root through sudo are theirs.
    pub fn give(&self, path: &Path) -> std::io::Result<()> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
    }
}
