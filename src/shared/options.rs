//! How a shared file is opened: what to do when it holds another quota, whom to trust
//! besides this process's user, and the name of the limit it holds.

/// What opening a shared file does when the file already holds another quota (or, for
/// a keyed file, was made for another number of keys) than the caller's.
///
/// # Examples
///
/// ```
/// use paceline::shared::OnMismatch;
/// assert_ne!(OnMismatch::Refuse, OnMismatch::Adopt);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OnMismatch {
    /// An error that names both ([`SharedError::QuotaMismatch`](super::SharedError::QuotaMismatch)):
    /// two programs that disagree about a quota are usually a mistake.
    #[default]
    Refuse,
    /// Use the file's: this process follows whatever the others set.
    Adopt,
    /// Set the caller's, for every process that has the file open (a deploy that changes
    /// the quota). Key slots cannot be replaced: a keyed file keeps its size.
    Replace,
}

/// How to open a shared file (module docs of [`crate::shared`], "Who can use a file").
///
/// By default a file is opened only if this process's effective user owns it and no one
/// else can write it; new files are readable and writable by their owner only. A group
/// of users that should share a limiter is named with [`OpenOptions::trust_group`]; a
/// service account that makes the file for others, with [`OpenOptions::trust_user`].
/// An [`OnMismatch`] converts into options, so `open_with(path, quota, OnMismatch::Adopt)`
/// reads as before.
///
/// # Examples
///
/// ```
/// use paceline::shared::{OnMismatch, OpenOptions, SharedLimiter};
/// use paceline::Quota;
///
/// # let path = std::env::temp_dir().join(format!("paceline-doc-opts-{}", std::process::id()));
/// // Workers running as several users of one group (here the caller's own group) share
/// // one limiter.
/// // SAFETY: `getegid` reads the process's group id; it has no preconditions.
/// let group = unsafe { libc::getegid() };
/// let options = OpenOptions::new().trust_group(group).on_mismatch(OnMismatch::Adopt);
/// let limiter = SharedLimiter::open_with(&path, Quota::per_second(10), options)?;
/// assert!(limiter.check().is_ok());
/// # std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenOptions {
    pub(super) on_mismatch: OnMismatch,
    pub(super) trust_user: Option<u32>,
    pub(super) trust_group: Option<u32>,
    pub(super) name: Option<String>,
}

impl OpenOptions {
    /// The defaults: refuse another quota, trust only this process's user, no name.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::OpenOptions;
    /// assert_eq!(OpenOptions::new(), OpenOptions::default());
    /// ```
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// What to do when the file holds another quota (or capacity).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::{OnMismatch, OpenOptions};
    /// let adopt = OpenOptions::new().on_mismatch(OnMismatch::Adopt);
    /// assert_eq!(adopt, OnMismatch::Adopt.into());
    /// ```
    pub fn on_mismatch(mut self, on_mismatch: OnMismatch) -> OpenOptions {
        self.on_mismatch = on_mismatch;
        self
    }

    /// Also opens files that user `uid` owns (a service account that makes the file for
    /// workers running as other users). The file must still not be writable by its group
    /// (unless that group is trusted too) or by others.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::OpenOptions;
    /// let options = OpenOptions::new().trust_user(33); // www-data on Debian
    /// # let _ = options;
    /// ```
    pub fn trust_user(mut self, uid: u32) -> OpenOptions {
        self.trust_user = Some(uid);
        self
    }

    /// Also opens files of group `gid`, whoever owns them, when only the owner and that
    /// group can write them; and makes new files that group's, readable and writable by it
    /// (mode `0660`). For workers running as several users of one group. This process must
    /// belong to the group to make a file for it.
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::OpenOptions;
    /// let options = OpenOptions::new().trust_group(1001);
    /// # let _ = options;
    /// ```
    pub fn trust_group(mut self, gid: u32) -> OpenOptions {
        self.trust_group = Some(gid);
        self
    }

    /// The name of the limit the file holds (at most
    /// [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes): written into a new file, and checked
    /// against an existing one's, so that two limits never share a file by mistake
    /// ([`SharedError::NameMismatch`](super::SharedError::NameMismatch)). Without a name,
    /// any file's name is accepted (and a new file has none).
    ///
    /// # Examples
    ///
    /// ```
    /// use paceline::shared::{OpenOptions, SharedError, SharedKeyedLimiter};
    /// use paceline::Quota;
    ///
    /// # let path = std::env::temp_dir().join(format!("paceline-doc-name-{}", std::process::id()));
    /// let quota = Quota::per_minute(5);
    /// let per_ip = SharedKeyedLimiter::open_with(&path, quota, 1024, OpenOptions::new().name("per-ip"))?;
    /// let login = SharedKeyedLimiter::open_with(&path, quota, 1024, OpenOptions::new().name("login"));
    /// assert!(matches!(login, Err(SharedError::NameMismatch { .. })));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> OpenOptions {
        self.name = Some(name.into());
        self
    }
}

impl From<OnMismatch> for OpenOptions {
    fn from(on_mismatch: OnMismatch) -> OpenOptions {
        OpenOptions::new().on_mismatch(on_mismatch)
    }
}
