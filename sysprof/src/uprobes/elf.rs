//! Where a function starts in an ELF file, for a uprobe: its exported symbols and their file
//! offsets. Read through a cache, so a 400 MB library (libnccl) is not read whole.

use std::{collections::HashMap, fs::File, path::Path};

use anyhow::Context as _;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, ReadCache, ReadRef};

/// Exported function name -> file offset of its first instruction.
pub type Exports = HashMap<String, u64>;

/// The functions `path` defines: its dynamic symbols, then its static symbol table when it has
/// one (programs keep their own functions there).
pub fn exported_functions(path: &Path) -> anyhow::Result<Exports> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).with_context(|| format!("reading ELF {}", path.display()))?;
    let mut exports = Exports::new();
    let add = |exports: &mut Exports, symbol: object::Symbol<'_, '_, &ReadCache<File>>| {
        if symbol.kind() != object::SymbolKind::Text || symbol.is_undefined() || symbol.address() == 0 {
            return;
        }
        let (Ok(name), Some(offset)) = (symbol.name(), file_offset(&elf, &symbol)) else { return };
        // Versioned names (cudaMalloc@@libcudart.so.12) answer to their plain name too.
        let plain = name.split('@').next().unwrap_or(name);
        exports.entry(plain.to_string()).or_insert(offset);
    };
    for symbol in elf.dynamic_symbols() {
        add(&mut exports, symbol);
    }
    for symbol in elf.symbols() {
        add(&mut exports, symbol);
    }
    Ok(exports)
}

/// Where `symbol`'s address lies in the file `elf` was read from (what a uprobe is attached at).
pub fn file_offset<'data, R: ReadRef<'data>>(
    elf: &object::File<'data, R>,
    symbol: &object::Symbol<'data, '_, R>,
) -> Option<u64> {
    let section = elf.section_by_index(symbol.section_index()?).ok()?;
    let (section_offset, _) = section.file_range()?;
    Some(symbol.address() - section.address() + section_offset)
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
                crate::procmaps::Backing::File { path, open } if m.module_name().starts_with("libc.so") => {
                    let _ = path;
                    Some(open.clone())
                }
                _ => None,
            })
            .expect("this test links libc");
        let exports = exported_functions(&libc).unwrap();
        assert!(exports.contains_key("malloc"), "{} exports", exports.len());
        assert!(exports["malloc"] > 0);
    }
}
