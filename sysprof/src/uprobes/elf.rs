//! Where a function starts in an ELF file, for a uprobe: its exported symbols and their file
//! offsets. Read through a cache, so a 400 MB library (libnccl) is not read whole, with a bound
//! (see `mapped::Bounded`), so a file whose headers claim more than it holds is not read either.

use std::{collections::HashMap, fs::File, path::Path};

use anyhow::Context as _;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, ReadRef};

use crate::mapped::{self, Bounded};

/// The functions a file defines: where each starts in the file, and how long it is.
#[derive(Clone, Debug, Default)]
pub struct Exports {
    /// Name -> file offset of its first instruction.
    offsets: HashMap<String, u64>,
    /// File offset -> the function's size in bytes, where its symbol gives one.
    sizes: HashMap<u64, u64>,
}

impl Exports {
    /// The file offset of function `name`'s first instruction.
    pub fn get(&self, name: &str) -> Option<&u64> {
        self.offsets.get(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.offsets.contains_key(name)
    }

    /// The size of the function that starts at file offset `offset`, when its symbol says.
    pub fn size_at(&self, offset: u64) -> Option<u64> {
        self.sizes.get(&offset).copied()
    }

    /// Every function: its name and file offset.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.offsets.iter().map(|(name, &offset)| (name.as_str(), offset))
    }
}

/// The functions `path` defines: its dynamic symbols, then its static symbol table when it has
/// one (programs keep their own functions there).
pub fn exported_functions(path: &Path) -> anyhow::Result<Exports> {
    let file = crate::input::open_regular(path, crate::input::Links::Follow)?;
    exports_of(file, path)
}

/// The functions `file` (opened from `path`) defines, as [`exported_functions`].
pub fn exports_of(file: File, path: &Path) -> anyhow::Result<Exports> {
    let cache = Bounded::new(file, mapped::READ_LIMIT);
    let elf = object::File::parse(&cache).with_context(|| format!("reading ELF {}", path.display()))?;
    Ok(exports_in(&elf))
}

/// [`exported_functions`] of a parsed file (`fuzzing::uprobe_exports` parses bytes).
pub fn exports_in<'data, R: ReadRef<'data>>(elf: &object::File<'data, R>) -> Exports {
    let mut exports = Exports::default();
    let add = |exports: &mut Exports, symbol: object::Symbol<'data, '_, R>| {
        if symbol.kind() != object::SymbolKind::Text || symbol.is_undefined() || symbol.address() == 0 {
            return;
        }
        let (Ok(name), Some(offset)) = (symbol.name(), file_offset(elf, &symbol)) else { return };
        // Versioned names (cudaMalloc@@libcudart.so.12) answer to their plain name too.
        let plain = name.split('@').next().unwrap_or(name);
        exports.offsets.entry(plain.to_string()).or_insert(offset);
        if symbol.size() > 0 {
            exports.sizes.entry(offset).or_insert(symbol.size());
        }
    };
    for symbol in elf.dynamic_symbols() {
        add(&mut exports, symbol);
    }
    for symbol in elf.symbols() {
        add(&mut exports, symbol);
    }
    exports
}

/// Where `symbol`'s address lies in the file `elf` was read from (what a uprobe is attached at).
pub fn file_offset<'data, R: ReadRef<'data>>(
    elf: &object::File<'data, R>,
    symbol: &object::Symbol<'data, '_, R>,
) -> Option<u64> {
    let section = elf.section_by_index(symbol.section_index()?).ok()?;
    let (section_offset, _) = section.file_range()?;
    // Checked: a symbol's address is the file's word, and may lie outside its section.
    symbol.address().checked_sub(section.address())?.checked_add(section_offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_exports() {
        let maps = crate::procmaps::ProcessMaps::read(std::process::id()).unwrap();
        let libc = maps
            .mappings()
            .iter()
            .find_map(|m| match &m.backing {
                crate::procmaps::Backing::File { path, open, .. }
                    if m.module_name().starts_with("libc.so") =>
                {
                    let _ = path;
                    Some(open.clone())
                }
                _ => None,
            })
            .expect("this test links libc");
        let exports = exported_functions(&libc).unwrap();
        assert!(exports.contains_key("malloc"), "{} exports", exports.offsets.len());
        let malloc = *exports.get("malloc").unwrap();
        assert!(malloc > 0);
        // Its size, for uprobes::entry_point.
        assert!(exports.size_at(malloc).is_some_and(|size| size > 16), "{:?}", exports.size_at(malloc));
    }
}
