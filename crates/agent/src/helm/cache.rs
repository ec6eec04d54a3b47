//! The chart cache: archives by sha256 (`<digest>.tgz`, charts only, never values or
//! credentials), bounded in bytes (`--chart-cache-max-bytes`); beyond it the least recently
//! used archives are evicted. "Used" is the file's modification time, set on every hit.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tender_types::conditions::reason;

use super::ChartFailure;

/// One archive in the cache, as the eviction choice sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    /// The file name (`<digest>.tgz`).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was last stored or used.
    pub used: SystemTime,
}

/// The archives to evict so that the cache holds at most `max_bytes`: least recently used
/// first (ties by name), never `keep` (the archive about to be rendered).
pub fn evictions(entries: &[CacheEntry], max_bytes: u64, keep: &str) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut oldest: Vec<&CacheEntry> = entries.iter().filter(|e| e.name != keep).collect();
    oldest.sort_by(|a, b| a.used.cmp(&b.used).then_with(|| a.name.cmp(&b.name)));
    let mut out = Vec::new();
    for e in oldest {
        if total <= max_bytes {
            break;
        }
        total -= e.bytes;
        out.push(e.name.clone());
    }
    out
}

/// The chart cache of one agent.
pub(crate) struct Cache {
    dir: PathBuf,
    max_bytes: u64,
}

impl Cache {
    pub(crate) fn new(dir: PathBuf, max_bytes: u64) -> Self {
        Self { dir, max_bytes }
    }

    /// The directory (helm's own homes live below it).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cached archive of `digest` (sha256 hex), if any; marks it used.
    pub(crate) fn get(&self, digest: &str) -> Option<PathBuf> {
        let path = self.dir.join(format!("{digest}.tgz"));
        let file = std::fs::File::options().append(true).open(&path).ok()?;
        let _ = file.set_modified(SystemTime::now());
        Some(path)
    }

    /// Writes an archive under its digest (temporary file + rename), then evicts the least
    /// recently used archives beyond the cache's size.
    pub(crate) fn store(&self, digest: &str, archive: &[u8]) -> Result<PathBuf, ChartFailure> {
        let path = self.write(digest, archive).map_err(|e| {
            ChartFailure::new(
                reason::CHART_RENDER_FAILED,
                format!("writing the chart cache {}: {e}", self.dir.display()),
            )
        })?;
        if let Err(e) = self.evict(&format!("{digest}.tgz")) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "chart cache eviction");
        }
        Ok(path)
    }

    fn write(&self, digest: &str, archive: &[u8]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(format!("{digest}.tgz"));
        let tmp = self
            .dir
            .join(format!(".{digest}.{}.partial", std::process::id()));
        std::fs::write(&tmp, archive)?;
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }

    fn evict(&self, keep: &str) -> std::io::Result<()> {
        let mut entries = Vec::new();
        for e in std::fs::read_dir(&self.dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata()?;
            if !meta.is_file() || !name.ends_with(".tgz") || name.starts_with('.') {
                continue;
            }
            entries.push(CacheEntry {
                name,
                bytes: meta.len(),
                used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        for name in evictions(&entries, self.max_bytes, keep) {
            tracing::debug!(archive = %name, "chart cache: evicted");
            std::fs::remove_file(self.dir.join(name))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entry(name: &str, bytes: u64, age_s: u64) -> CacheEntry {
        CacheEntry {
            name: name.to_string(),
            bytes,
            used: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 - age_s),
        }
    }

    #[test]
    fn least_recently_used_go_first_until_the_cache_fits() {
        let e = [
            entry("a.tgz", 40, 10),
            entry("b.tgz", 40, 30),
            entry("c.tgz", 40, 20),
            entry("d.tgz", 40, 0),
        ];
        assert_eq!(evictions(&e, 160, "d.tgz"), Vec::<String>::new(), "fits");
        assert_eq!(evictions(&e, 120, "d.tgz"), ["b.tgz"]);
        assert_eq!(evictions(&e, 80, "d.tgz"), ["b.tgz", "c.tgz"]);
        assert_eq!(evictions(&e, 0, "d.tgz"), ["b.tgz", "c.tgz", "a.tgz"]);
    }

    #[test]
    fn the_archive_in_use_is_never_evicted_even_when_it_alone_is_too_large() {
        let e = [entry("old.tgz", 10, 50), entry("big.tgz", 500, 100)];
        assert_eq!(evictions(&e, 100, "big.tgz"), ["old.tgz"]);
        assert_eq!(
            evictions(&[entry("big.tgz", 500, 0)], 100, "big.tgz"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ties_break_by_name() {
        let e = [
            entry("b.tgz", 10, 5),
            entry("a.tgz", 10, 5),
            entry("k.tgz", 1, 0),
        ];
        assert_eq!(evictions(&e, 11, "k.tgz"), ["a.tgz"]);
    }

    #[test]
    fn a_hit_marks_the_archive_used_and_a_store_evicts_the_oldest() {
        let dir = std::env::temp_dir().join(format!("tender-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = Cache::new(dir.clone(), 25);
        cache.store("aa", &[0; 10]).unwrap();
        cache.store("bb", &[0; 10]).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        for n in ["aa", "bb"] {
            let f = std::fs::File::options()
                .append(true)
                .open(dir.join(format!("{n}.tgz")))
                .unwrap();
            f.set_modified(old).unwrap();
        }
        assert!(cache.get("aa").is_some(), "a hit");
        cache.store("cc", &[0; 10]).unwrap();
        assert!(
            cache.get("bb").is_none(),
            "bb, least recently used, evicted"
        );
        assert!(cache.get("aa").is_some() && cache.get("cc").is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
