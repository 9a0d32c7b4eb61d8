//! A directory of a test's own, removed when dropped.

use std::fs;
use std::path::PathBuf;

pub(crate) struct Dir(pub(crate) PathBuf);

impl Dir {
    /// `<tmp>/paceline-<name>-<pid>`, empty.
    pub(crate) fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("paceline-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    /// Like `/dev/shm`: anyone may create files in it, no one may remove another's
    /// (mode 1777).
    pub(crate) fn sticky(name: &str) -> Dir {
        use std::os::unix::fs::PermissionsExt;
        let dir = Dir::new(name);
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o1777)).unwrap();
        dir
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
