//! Power-loss simulation in the spirit of ALICE (Pillai et al., OSDI 2014): record one
//! save's operations through the seam, then build every crash state the persistence
//! model allows and check that loading gives exactly the old or the new checkpoint.
//!
//! The model: a file's data is durable only once the file is fsynced; until then a
//! crash may leave its previous durable content, a truncated prefix of the new one,
//! or all of it. A directory entry created, renamed or removed is durable only once
//! its parent directory is fsynced; until then each such operation may or may not
//! have reached the disk, independently of the others (applied in program order; a
//! rename is atomic in itself).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use super::fsops::{Op, RecordingFs};
use super::tests::{contents, request};
use super::*;

type Ino = usize;

#[derive(Debug, Clone)]
enum Node {
    File { data: Vec<u8>, durable: Vec<u8> },
    Dir,
}

#[derive(Debug, Clone)]
enum EntryOp {
    Link(String, Ino),
    Unlink(String),
    Rename(String, String, Ino),
}

type Entries = BTreeMap<String, Ino>;
/// One crash state: every directory's entries and the content of every unsynced file.
type CrashState = (BTreeMap<Ino, Entries>, BTreeMap<Ino, Vec<u8>>);

fn apply(entries: &mut Entries, op: &EntryOp) {
    match op {
        EntryOp::Link(name, ino) => {
            entries.insert(name.clone(), *ino);
        }
        EntryOp::Unlink(name) => {
            entries.remove(name);
        }
        EntryOp::Rename(from, to, ino) => {
            entries.remove(from);
            entries.insert(to.clone(), *ino);
        }
    }
}

/// The file system as the program sees it and as the disk is guaranteed to hold it.
#[derive(Debug, Clone, Default)]
struct Model {
    nodes: Vec<Node>,
    current: BTreeMap<Ino, Entries>,
    durable: BTreeMap<Ino, Entries>,
    pending: BTreeMap<Ino, Vec<EntryOp>>,
    unsynced: BTreeSet<Ino>,
}

const ROOT: Ino = 0;

impl Model {
    /// Everything under `root` as it is on disk now, all durable.
    fn snapshot(root: &Path) -> Self {
        let mut m = Model {
            nodes: vec![Node::Dir],
            ..Model::default()
        };
        m.load_dir(ROOT, root);
        m
    }

    fn load_dir(&mut self, ino: Ino, path: &Path) {
        let mut entries = Entries::new();
        for e in fs::read_dir(path).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let child = self.nodes.len();
            if e.file_type().unwrap().is_dir() {
                self.nodes.push(Node::Dir);
                self.load_dir(child, &e.path());
            } else {
                let data = fs::read(e.path()).unwrap();
                self.nodes.push(Node::File {
                    data: data.clone(),
                    durable: data,
                });
            }
            entries.insert(name, child);
        }
        self.current.insert(ino, entries.clone());
        self.durable.insert(ino, entries);
    }

    fn resolve(&self, rel: &Path) -> Option<Ino> {
        let mut ino = ROOT;
        for c in rel.components() {
            ino = *self.current.get(&ino)?.get(c.as_os_str().to_str()?)?;
        }
        Some(ino)
    }

    fn parent_and_name(&self, rel: &Path) -> (Ino, String) {
        let parent = rel.parent().unwrap_or(Path::new(""));
        let name = rel.file_name().unwrap().to_string_lossy().into_owned();
        (self.resolve(parent).expect("parent exists"), name)
    }

    fn entry_op(&mut self, dir: Ino, op: EntryOp) {
        apply(self.current.get_mut(&dir).unwrap(), &op);
        self.pending.entry(dir).or_default().push(op);
    }

    fn unlink_tree(&mut self, dir: Ino, name: &str) {
        let ino = self.current[&dir][name];
        if let Node::Dir = self.nodes[ino] {
            let children: Vec<String> = self.current[&ino].keys().cloned().collect();
            for c in children {
                self.unlink_tree(ino, &c);
            }
        }
        self.entry_op(dir, EntryOp::Unlink(name.to_string()));
    }

    fn run(&mut self, root: &Path, op: &Op) {
        let rel = |p: &Path| p.strip_prefix(root).unwrap().to_path_buf();
        match op {
            Op::CreateDirAll(p) => assert!(self.resolve(&rel(p)).is_some()),
            Op::CreateDir(p) => {
                let (dir, name) = self.parent_and_name(&rel(p));
                let ino = self.nodes.len();
                self.nodes.push(Node::Dir);
                self.current.insert(ino, Entries::new());
                self.durable.insert(ino, Entries::new());
                self.entry_op(dir, EntryOp::Link(name, ino));
            }
            Op::WriteFile { path, data } => {
                let (dir, name) = self.parent_and_name(&rel(path));
                match self.current[&dir].get(&name).copied() {
                    Some(ino) => match &mut self.nodes[ino] {
                        Node::File { data: d, .. } => *d = data.clone(),
                        Node::Dir => panic!("write over a directory"),
                    },
                    None => {
                        let ino = self.nodes.len();
                        self.nodes.push(Node::File {
                            data: data.clone(),
                            durable: Vec::new(),
                        });
                        self.entry_op(dir, EntryOp::Link(name, ino));
                    }
                }
                let ino = self.resolve(&rel(path)).unwrap();
                self.unsynced.insert(ino);
            }
            Op::FsyncFile(p) => {
                let ino = self.resolve(&rel(p)).unwrap();
                if let Node::File { data, durable } = &mut self.nodes[ino] {
                    *durable = data.clone();
                }
                self.unsynced.remove(&ino);
            }
            Op::FsyncDir(p) => {
                let ino = self.resolve(&rel(p)).unwrap();
                self.durable.insert(ino, self.current[&ino].clone());
                self.pending.remove(&ino);
            }
            Op::Rename { from, to } => {
                let (dir, a) = self.parent_and_name(&rel(from));
                let (dir2, b) = self.parent_and_name(&rel(to));
                assert_eq!(dir, dir2, "the protocol renames within one directory");
                let ino = self.current[&dir][&a];
                self.entry_op(dir, EntryOp::Rename(a, b, ino));
            }
            Op::Exchange { .. } => panic!("the simulated save does not overwrite"),
            Op::RemoveDirAll(p) | Op::RemoveFile(p) => {
                let (dir, name) = self.parent_and_name(&rel(p));
                self.unlink_tree(dir, &name);
            }
        }
    }

    /// Every crash state of the model now, as (dir entries, file contents) choices.
    fn crash_states(&self) -> Vec<CrashState> {
        // Directory choices: for each directory with pending operations, every subset.
        let mut dir_states: Vec<BTreeMap<Ino, Entries>> = vec![self.durable.clone()];
        for (&dir, ops) in &self.pending {
            assert!(ops.len() <= 12, "too many pending operations to enumerate");
            let mut next = Vec::new();
            for base in &dir_states {
                for mask in 0u32..(1 << ops.len()) {
                    let mut entries = self.durable[&dir].clone();
                    for (i, op) in ops.iter().enumerate() {
                        if mask & (1 << i) != 0 {
                            apply(&mut entries, op);
                        }
                    }
                    let mut s = base.clone();
                    s.insert(dir, entries);
                    next.push(s);
                }
            }
            dir_states = next;
        }
        // File choices: durable, a truncated prefix, or all of the unsynced data.
        let mut file_states: Vec<BTreeMap<Ino, Vec<u8>>> = vec![BTreeMap::new()];
        for &ino in &self.unsynced {
            let Node::File { data, durable } = &self.nodes[ino] else {
                continue;
            };
            let mut variants = vec![
                durable.clone(),
                data[..data.len() / 2].to_vec(),
                data.clone(),
            ];
            variants.dedup();
            let mut next = Vec::new();
            for base in &file_states {
                for v in &variants {
                    let mut s = base.clone();
                    s.insert(ino, v.clone());
                    next.push(s);
                }
            }
            file_states = next;
        }
        let mut out = Vec::new();
        for d in &dir_states {
            for f in &file_states {
                out.push((d.clone(), f.clone()));
            }
        }
        out
    }

    fn materialize(
        &self,
        dirs: &BTreeMap<Ino, Entries>,
        files: &BTreeMap<Ino, Vec<u8>>,
        ino: Ino,
        path: &Path,
        seen: &mut BTreeSet<Ino>,
    ) {
        assert!(seen.insert(ino), "an inode reachable twice");
        for (name, &child) in &dirs[&ino] {
            let p = path.join(name);
            match &self.nodes[child] {
                Node::Dir => {
                    fs::create_dir(&p).unwrap();
                    self.materialize(dirs, files, child, &p, seen);
                }
                Node::File { durable, .. } => {
                    fs::write(&p, files.get(&child).unwrap_or(durable)).unwrap();
                }
            }
        }
    }
}

impl Model {
    /// A canonical description of a crash state's tree, to count distinct states
    /// without writing them out.
    fn describe(
        &self,
        dirs: &BTreeMap<Ino, Entries>,
        files: &BTreeMap<Ino, Vec<u8>>,
        ino: Ino,
        prefix: &str,
        out: &mut Vec<(String, Option<Vec<u8>>)>,
    ) {
        for (name, &child) in &dirs[&ino] {
            let path = format!("{prefix}/{name}");
            match &self.nodes[child] {
                Node::Dir => {
                    out.push((path.clone(), None));
                    self.describe(dirs, files, child, &path, out);
                }
                Node::File { durable, .. } => {
                    out.push((path, Some(files.get(&child).unwrap_or(durable).clone())));
                }
            }
        }
    }
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: a simulated power loss at every instant of one save, each followed by the same load checks"
)]
fn power_loss_at_every_instant_loads_old_or_new() {
    let real = tempfile::tempdir().unwrap();
    let root = real.path();
    save(root, request(5)).unwrap();
    // Leftovers of earlier crashes: a tmp of the step being saved and of another step.
    fs::create_dir(root.join("step-000007.tmp")).unwrap();
    fs::write(root.join("step-000007.tmp/model.safetensors"), b"junk").unwrap();
    fs::create_dir(root.join("step-000003.tmp")).unwrap();
    fs::write(root.join("step-000003.tmp/MANIFEST.json"), b"{").unwrap();
    let old = contents(&root.join("step-000005"));
    let initial = Model::snapshot(root);

    let mut rec = RecordingFs::new();
    let mut req = request(7);
    req.keep = Some(1);
    save_with(&mut rec, root, req).unwrap();
    let new = contents(&root.join("step-000007"));
    assert_ne!(old, new);
    // After the last fsync of the parent that follows the LATEST rename, the save is
    // durable: every crash state from there on must load the new step.
    let latest_rename = rec
        .ops
        .iter()
        .position(|o| matches!(o, Op::Rename { to, .. } if to.ends_with(LATEST_NAME)))
        .unwrap();
    let declared = latest_rename
        + 1
        + rec.ops[latest_rename + 1..]
            .iter()
            .position(|o| matches!(o, Op::FsyncDir(_)))
            .unwrap();

    let scratch = tempfile::tempdir().unwrap();
    let mut model = initial;
    let mut states = 0usize;
    let mut distinct = BTreeSet::new();
    let mut loaded_steps = BTreeMap::new();
    for p in 0..=rec.ops.len() {
        if p > 0 {
            model.run(root, &rec.ops[p - 1]);
        }
        for (dirs, files) in model.crash_states() {
            states += 1;
            let mut fp = Vec::new();
            model.describe(&dirs, &files, ROOT, "", &mut fp);
            if !distinct.insert(fp) {
                continue;
            }
            let dir = scratch.path().join(format!("s{states}"));
            fs::create_dir(&dir).unwrap();
            model.materialize(&dirs, &files, ROOT, &dir, &mut BTreeSet::new());
            {
                let loaded = load(&dir, None)
                    .unwrap_or_else(|e| panic!("after op {p}: no checkpoint loads: {e}"));
                let got = contents(&loaded.path);
                assert!(
                    (loaded.step == 5 && got == old) || (loaded.step == 7 && got == new),
                    "after op {p}: step {} with mixed bytes",
                    loaded.step
                );
                if p > declared {
                    assert_eq!(loaded.step, 7, "after op {p}: a declared save was lost");
                }
                // LATEST never names a directory that is missing or incomplete, and
                // once the save is declared it names the new step.
                let listing = list(&dir).unwrap();
                if p > declared {
                    assert_eq!(listing.latest(), Latest::Names(7), "after op {p}");
                }
                if let Some(n) = listing.latest().step() {
                    let sd = dir.join(step_name(n));
                    assert!(
                        n == 5 || verify(&sd).is_empty(),
                        "after op {p}: LATEST names a broken {}",
                        step_name(n)
                    );
                }
                *loaded_steps.entry(loaded.step).or_insert(0usize) += 1;
            }
            fs::remove_dir_all(&dir).unwrap();
        }
    }
    eprintln!(
        "power-loss simulation: {} operations, {states} crash states, {} distinct, loads {:?}",
        rec.ops.len(),
        distinct.len(),
        loaded_steps
    );
    assert!(states >= 500, "only {states} crash states");
    assert!(
        distinct.len() >= 100,
        "only {} distinct states",
        distinct.len()
    );
    assert!(loaded_steps.contains_key(&5) && loaded_steps.contains_key(&7));
}
