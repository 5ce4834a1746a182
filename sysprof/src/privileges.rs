//! Privileges: whether sysprof may load BPF programs, who the user behind `sudo` is (they own
//! the output files and run `-- CMD`), and the rules that keep a sudo rule for sysprof alone
//! from granting more:
//!
//! - what sysprof creates for the user, it creates *as* the user ([`InvokingUser::act`]: the
//!   filesystem identity of one thread), so a path they control cannot redirect a write of
//!   root's, and what they get is theirs from the start;
//! - a file the user names is opened as them, once, and only that descriptor is read after
//!   (`uprobes::Binary::open`): a link they flip cannot have root open something else by the
//!   same name; what their command runs and loads is looked for with their rights too;
//! - a library sysprof loads into itself as root must be root's and writable by no one else
//!   ([`trusted_library`]): its code would run as root.

use std::{
    ffi::CString,
    marker::PhantomData,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

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

/// Whether CAP_SYS_ADMIN is effective: attaching a perf-event uprobe (the kind left where the
/// kernel makes no multi-uprobe links) needs it besides CAP_BPF and CAP_PERFMON
/// (perf_event_open answers EACCES without it).
pub fn has_sys_admin() -> bool {
    effective_capabilities().is_some_and(|caps| caps & (1u64 << CAP_SYS_ADMIN) != 0)
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

    /// Takes on this user's filesystem identity (uid, gid and groups) on the calling thread
    /// until the guard drops: files are then opened, created and renamed with exactly the
    /// user's rights, and belong to them. Root's other threads keep theirs.
    pub fn act(&self) -> std::io::Result<ActingAs> {
        let saved = thread_groups()?;
        // What to come back to (root's, unless a guard is held already: the outer one's).
        // SAFETY: an invalid id (-1) changes nothing and returns the current one.
        let saved_ids = unsafe { (libc::setfsuid(u32::MAX) as u32, libc::setfsgid(u32::MAX) as u32) };
        // The raw syscalls: glibc's setgroups changes every thread of the process.
        set_thread_groups(&self.groups)?;
        // SAFETY: setfsgid/setfsuid only change this thread's filesystem ids.
        unsafe {
            libc::setfsgid(self.gid);
            libc::setfsuid(self.uid);
        }
        let guard = ActingAs { saved, saved_ids, _one_thread: PhantomData };
        // Both calls return the previous id: an invalid id (-1) reads the current one.
        // SAFETY: as above; -1 changes nothing.
        let (fsuid, fsgid) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
        if (fsuid as u32, fsgid as u32) != (self.uid, self.gid) {
            return Err(std::io::Error::other(format!("could not act as uid {}", self.uid)));
        }
        Ok(guard)
    }

    /// Whether this user could open `path` for reading themselves.
    pub fn can_read(&self, path: &Path) -> bool {
        self.act().is_ok_and(|_as_user| std::fs::File::open(path).is_ok())
    }
}

/// Runs `f` as `user` (see [`InvokingUser::act`]), or as sysprof itself when there is none.
pub fn as_user<T>(user: Option<&InvokingUser>, f: impl FnOnce() -> T) -> std::io::Result<T> {
    let _guard = user.map(InvokingUser::act).transpose()?;
    Ok(f())
}

/// The invoking user's filesystem identity on one thread; root's comes back on drop. Not
/// `Send`: it must drop on the thread it changed.
#[must_use]
pub struct ActingAs {
    saved: Vec<libc::gid_t>,
    /// The filesystem uid and gid before.
    saved_ids: (u32, u32),
    _one_thread: PhantomData<*const ()>,
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // SAFETY: back to the filesystem ids before (root's) on this thread.
        unsafe {
            libc::setfsuid(self.saved_ids.0);
            libc::setfsgid(self.saved_ids.1);
        }
        let _ = set_thread_groups(&self.saved);
    }
}

fn thread_groups() -> std::io::Result<Vec<libc::gid_t>> {
    let mut groups = vec![0; 1024];
    // SAFETY: the buffer holds `groups.len()` entries.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, groups.len() as libc::c_long, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

fn set_thread_groups(groups: &[libc::gid_t]) -> std::io::Result<()> {
    // SAFETY: `groups` is a valid array of its length; the raw syscall changes this thread only.
    let result = unsafe { libc::syscall(libc::SYS_setgroups, groups.len() as libc::c_long, groups.as_ptr()) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `path` as a library root may load: the file and every directory above it owned by root and
/// writable by no one else (a sticky directory, as /tmp, cannot have root's entries replaced).
/// Returns the resolved path to load, so nothing can be swapped in between; the error says
/// which part fails and how to fix it.
pub fn trusted_library(path: &Path) -> Result<PathBuf, String> {
    let resolved = path.canonicalize().map_err(|e| format!("{}: {e}", path.display()))?;
    for part in resolved.ancestors() {
        let meta = std::fs::metadata(part).map_err(|e| format!("{}: {e}", part.display()))?;
        let writable_by_others = meta.mode() & 0o022 != 0;
        let sticky_dir = meta.is_dir() && meta.mode() & 0o1000 != 0 && part != resolved;
        if meta.uid() != 0 || (writable_by_others && !sticky_dir) {
            return Err(format!(
                "{}: {} is {}: as root, sysprof loads only libraries that root owns and no one else can change \
                 (`sudo chown root:root` it and `sudo chmod go-w` it, or copy it under /usr/local/lib)",
                path.display(),
                part.display(),
                if meta.uid() != 0 {
                    format!("owned by uid {}", meta.uid())
                } else {
                    "writable by others".to_string()
                }
            ));
        }
    }
    Ok(resolved)
}

/// kernel.perf_event_paranoid, when readable.
pub fn perf_event_paranoid() -> Option<i32> {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").ok()?.trim().parse().ok()
}

/// Whether sysprof runs as root, where [`trusted_library`] applies.
pub fn is_root() -> bool {
    Uid::effective().is_root()
}
