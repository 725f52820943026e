//! Safetensors shards: a single `model.safetensors` or an index with N shards, memory-mapped.
//!
//! Headers are parsed and validated by the `safetensors` crate; data is only ever read as byte
//! slices (data offsets need not be aligned).

use crate::error::{LoadError, Result};
use crate::tensor::DType;
use memmap2::Mmap;
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    /// `Err(spelling)` for a dtype no NemotronH tensor uses.
    pub dtype: std::result::Result<DType, String>,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub end: usize,
    /// Index into [`ShardSet::shards`].
    pub shard: usize,
}

pub struct Shard {
    pub path: PathBuf,
    pub mmap: Mmap,
    pub file_bytes: usize,
}

/// All shards of a checkpoint with their header entries.
pub struct ShardSet {
    pub shards: Vec<Shard>,
    pub entries: Vec<Entry>,
    pub by_name: HashMap<String, usize>,
}

impl ShardSet {
    /// Opens `dir/model.safetensors.index.json` and its shards, or `dir/model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        let (files, weight_map) = if index_path.exists() {
            let (files, map) = read_index(&index_path)?;
            (
                files.into_iter().map(|f| dir.join(f)).collect::<Vec<_>>(),
                Some(map),
            )
        } else if single.exists() {
            (vec![single], None)
        } else {
            return Err(LoadError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no {INDEX_FILE} and no {SINGLE_FILE} in this directory"),
                ),
            });
        };

        let mut set = ShardSet {
            shards: vec![],
            entries: vec![],
            by_name: HashMap::new(),
        };
        for path in files {
            if !path.exists() {
                return Err(LoadError::Index {
                    index: index_path.clone(),
                    reason: format!("names shard {} which does not exist", path.display()),
                });
            }
            set.add_shard(path)?;
        }

        if let Some(map) = weight_map {
            // The index and the shard headers must tell the same story.
            for (name, file) in &map {
                match set.by_name.get(name) {
                    None => {
                        return Err(LoadError::Index {
                            index: index_path,
                            reason: format!(
                                "maps tensor `{name}` to {file}, but that shard has no such tensor"
                            ),
                        })
                    }
                    Some(&i) => {
                        let shard = &set.shards[set.entries[i].shard].path;
                        if shard.file_name().and_then(|s| s.to_str()) != Some(file.as_str()) {
                            return Err(LoadError::Index {
                                index: index_path,
                                reason: format!(
                                    "maps tensor `{name}` to {file}, but it is stored in {}",
                                    shard.display()
                                ),
                            });
                        }
                    }
                }
            }
            for e in &set.entries {
                if !map.contains_key(&e.name) {
                    return Err(LoadError::Index {
                        index: index_path,
                        reason: format!(
                            "does not list tensor `{}` found in {}",
                            e.name,
                            set.shards[e.shard].path.display()
                        ),
                    });
                }
            }
        }
        Ok(set)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<()> {
        let io = |source| LoadError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the file is opened read-only and mapped privately; the loader never writes
        // through the mapping. A concurrent truncation by another process is outside our contract.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (n, _meta) =
            SafeTensors::read_metadata(&mmap).map_err(|e| shard_error(&path, &mmap, e))?;
        let data_start = 8 + n;
        let st = SafeTensors::deserialize(&mmap).map_err(|e| shard_error(&path, &mmap, e))?;
        let shard = self.shards.len();
        let mut tensors: Vec<_> = st.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, view) in tensors {
            let bytes = view.data();
            // The view borrows the mmap: its offset inside the file is its pointer distance.
            let start = bytes.as_ptr() as usize - mmap.as_ptr() as usize;
            debug_assert!(start >= data_start);
            let dtype =
                DType::from_name(&view.dtype().to_string()).ok_or_else(|| view.dtype().to_string());
            let entry = Entry {
                name: name.clone(),
                dtype,
                shape: view.shape().to_vec(),
                start,
                end: start + bytes.len(),
                shard,
            };
            if let Some(&prev) = self.by_name.get(&name) {
                return Err(LoadError::DuplicateTensor {
                    tensor: name,
                    first: self.shards[self.entries[prev].shard].path.clone(),
                    second: path.clone(),
                });
            }
            self.by_name.insert(name, self.entries.len());
            self.entries.push(entry);
        }
        let file_bytes = mmap.len();
        self.shards.push(Shard {
            path,
            mmap,
            file_bytes,
        });
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.by_name.get(name).map(|&i| &self.entries[i])
    }

    /// The bytes of a tensor, straight from the mapping.
    pub fn bytes(&self, e: &Entry) -> &[u8] {
        &self.shards[e.shard].mmap[e.start..e.end]
    }

    /// Tells the kernel the pages of a tensor already copied out are no longer needed, so the
    /// mapping does not double the resident size during a load.
    pub fn release(&self, e: &Entry) {
        let m = &self.shards[e.shard].mmap;
        if e.end > e.start {
            // SAFETY: read-only private file mapping that is never written: dropped pages are
            // re-read from the file on a later access, so no data can change or be lost.
            let _ = unsafe {
                m.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    e.start,
                    e.end - e.start,
                )
            };
        }
    }

    /// Sum of the tensor data bytes of all shards.
    pub fn data_bytes(&self) -> u64 {
        self.entries.iter().map(|e| (e.end - e.start) as u64).sum()
    }
}

/// Index files past this size are refused before they are read (a real one: ≈ 1.5 MB for the
/// 18,487 tensors of the 30B-A3B checkpoints).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Distinct shards one index may name (real ones: tens).
pub const MAX_SHARDS: usize = 1 << 16;

/// The index's `weight_map`, parsed as it streams in: a hostile index is refused at its first bad
/// entry or its first shard past [`MAX_SHARDS`], so the cost of a refusal stays bounded whatever
/// the file claims.
struct WeightMap {
    files: BTreeSet<String>,
    map: BTreeMap<String, String>,
}

impl<'de> serde::Deserialize<'de> for WeightMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WeightMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object mapping tensor names to shard file names")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<WeightMap, A::Error> {
                use serde::de::Error;
                let mut w = WeightMap {
                    files: BTreeSet::new(),
                    map: BTreeMap::new(),
                };
                while let Some((name, f)) = a.next_entry::<String, Value>()? {
                    let Value::String(f) = f else {
                        return Err(A::Error::custom(format!(
                            "weight_map entry `{name}` is not a file name"
                        )));
                    };
                    if f.contains('/') || f.contains('\\') || f == ".." {
                        return Err(A::Error::custom(format!(
                            "shard name {f:?} must be a plain file name"
                        )));
                    }
                    if !w.files.contains(&f) {
                        if w.files.len() == MAX_SHARDS {
                            return Err(A::Error::custom(format!(
                                "names more than {MAX_SHARDS} shards"
                            )));
                        }
                        w.files.insert(f.clone());
                    }
                    w.map.insert(name, f);
                }
                Ok(w)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(serde::Deserialize)]
struct IndexFile {
    weight_map: Option<WeightMap>,
}

/// Reads the index: the shard files (sorted) and the name → file map.
fn read_index(path: &Path) -> Result<(Vec<String>, BTreeMap<String, String>)> {
    let io = |source| LoadError::Io {
        path: path.into(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > MAX_INDEX_BYTES {
        return Err(LoadError::Index {
            index: path.into(),
            reason: format!(
                "is {size} bytes, past the {} MiB an index may take",
                MAX_INDEX_BYTES >> 20
            ),
        });
    }
    let idx: IndexFile = serde_json::from_reader(std::io::BufReader::new(file)).map_err(|e| {
        if e.is_data() {
            LoadError::Index {
                index: path.into(),
                reason: e.to_string(),
            }
        } else {
            LoadError::Json {
                path: path.into(),
                source: e,
            }
        }
    })?;
    let w = idx.weight_map.ok_or_else(|| LoadError::Index {
        index: path.into(),
        reason: "missing the `weight_map` object".into(),
    })?;
    if w.files.is_empty() {
        return Err(LoadError::Index {
            index: path.into(),
            reason: "the weight_map is empty".into(),
        });
    }
    Ok((w.files.into_iter().collect(), w.map))
}

/// Which tensor runs past the data section (the largest end offset), or how many bytes trail
/// the last tensor.
fn diagnose_extent(buf: &[u8]) -> Option<String> {
    let n = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?) as usize;
    let header: Value = serde_json::from_slice(buf.get(8..8usize.checked_add(n)?)?).ok()?;
    let data = buf.len().checked_sub(8usize.checked_add(n)?)? as u64;
    let (name, start, end) = header
        .as_object()?
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .filter_map(|(k, v)| {
            let o = v.get("data_offsets")?.as_array()?;
            Some((k.clone(), o.first()?.as_u64()?, o.get(1)?.as_u64()?))
        })
        .max_by_key(|t| t.2)?;
    Some(if end > data {
        format!(
            "tensor `{name}` claims bytes {start}..{end} of a data section of {data} bytes (truncated, or a claimed size the file does not hold)"
        )
    } else {
        format!(
            "{} bytes trail the last tensor (`{name}` ends at {end} of {data})",
            data - end
        )
    })
}

/// Turns a safetensors error into one that names the file and, where the crate does not, the
/// tensor at fault.
fn shard_error(path: &Path, buf: &[u8], e: safetensors::SafeTensorError) -> LoadError {
    use safetensors::SafeTensorError as E;
    let reason = match &e {
        E::HeaderTooSmall => "shorter than the 8-byte header length".to_string(),
        E::InvalidHeaderLength => {
            let n = buf
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .unwrap_or(0);
            format!(
                "header length {n} runs past the end of the file ({} bytes)",
                buf.len()
            )
        }
        E::HeaderTooLarge => "header length is implausibly large".to_string(),
        E::InvalidHeader(_) => "header is not UTF-8".to_string(),
        E::InvalidHeaderDeserialization(j) => format!("header is not valid JSON: {j}"),
        E::MetadataIncompleteBuffer => diagnose_extent(buf).unwrap_or_else(|| {
            "the data section is not the size the header declares (truncated or trailing bytes)"
                .to_string()
        }),
        E::TensorInvalidInfo | E::InvalidOffset(_) | E::MisalignedSlice | E::ValidationOverflow => {
            match diagnose_header(buf) {
                Some(t) => t,
                None => format!("{e}"),
            }
        }
        other => format!("{other}"),
    };
    LoadError::Shard {
        file: path.to_path_buf(),
        reason,
    }
}

/// Finds the first header entry whose byte range disagrees with its dtype and shape.
fn diagnose_header(buf: &[u8]) -> Option<String> {
    let n = usize::try_from(u64::from_le_bytes(buf.get(..8)?.try_into().ok()?)).ok()?;
    let v: Value = serde_json::from_slice(buf.get(8..8usize.checked_add(n)?)?).ok()?;
    for (name, info) in v.as_object()? {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info.get("dtype")?.as_str()?;
        let shape: Vec<u64> = info
            .get("shape")?
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        let off: Vec<u64> = info
            .get("data_offsets")?
            .as_array()?
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        let size = DType::from_name(dtype).map(|d| d.size() as u64)?;
        // A claimed shape can overflow u64 (the fuzz test found it): say so instead of wrapping.
        let want = shape.iter().try_fold(size, |a, &d| a.checked_mul(d));
        let span = if off.len() == 2 {
            off[1].saturating_sub(off[0])
        } else {
            continue;
        };
        match want {
            None => {
                return Some(format!(
                    "tensor `{name}`: {dtype} {shape:?} claims more than 2^64 bytes"
                ))
            }
            Some(want) if span != want => {
                return Some(format!(
                    "tensor `{name}`: data_offsets {off:?} span {span} bytes but {dtype} {shape:?} needs {want}"
                ))
            }
            Some(_) => {}
        }
    }
    Some("tensor data offsets overlap or leave gaps".into())
}
