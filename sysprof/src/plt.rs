//! Names for PLT stubs: a sample or a return address inside `.plt` or `.plt.sec` is the stub
//! of an imported function, which the symbol tables do not name (blazesym gives the nearest
//! symbol before it, `_init`). perf names them `puts@plt`; so does sysprof, from the ELF's own
//! tables: on x86-64 PLT entry `k` (16 bytes each; `.plt` starts with the resolver's entry 0)
//! jumps through the slot of the `k`-th JUMP_SLOT relocation, whose symbol is the function.

use std::ops::Range;

use object::{
    Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _, ReadRef, RelocationFlags,
};

/// The size of one PLT entry on x86-64.
const ENTRY: u64 = 16;
/// `R_X86_64_JUMP_SLOT`: a lazily bound function's GOT slot.
const JUMP_SLOT: u32 = 7;

/// One ELF file's PLT stubs by file offset.
#[derive(Debug, Default)]
pub struct PltNames {
    /// The file range of the stubs and the first stub's index in `names`.
    sections: Vec<(Range<u64>, usize)>,
    /// The JUMP_SLOT relocations' function names, in order.
    names: Vec<String>,
}

impl PltNames {
    /// The PLT names of a parsed file; empty when it has none or is not an x86-64 ELF.
    pub fn of<'data, R: ReadRef<'data>>(elf: &object::File<'data, R>) -> PltNames {
        Self::try_of(elf).unwrap_or_default()
    }

    /// The PLT names of an ELF file's bytes (the fuzz target's door, `fuzzing::plt`).
    pub fn parse(data: &[u8]) -> PltNames {
        object::File::parse(data).map(|elf| Self::of(&elf)).unwrap_or_default()
    }

    fn try_of<'data, R: ReadRef<'data>>(elf: &object::File<'data, R>) -> Option<PltNames> {
        if elf.architecture() != object::Architecture::X86_64 {
            return None;
        }
        let symbols = elf.dynamic_symbol_table()?;
        let names: Vec<String> = elf
            .dynamic_relocations()?
            .filter(|(_, relocation)| {
                matches!(relocation.flags(), RelocationFlags::Elf { r_type } if r_type == JUMP_SLOT)
            })
            .map(|(_, relocation)| match relocation.target() {
                object::RelocationTarget::Symbol(index) => symbols
                    .symbol_by_index(index)
                    .ok()
                    .and_then(|symbol| symbol.name().ok().map(str::to_string))
                    .unwrap_or_default(),
                _ => String::new(),
            })
            .collect();
        let mut sections = Vec::new();
        // With IBT the stubs a call goes to are in .plt.sec (entry k for slot k) and .plt holds
        // the lazy-binding entries; without it .plt is both, after the resolver's entry 0.
        let plt_sec = elf.section_by_name(".plt.sec").and_then(|s| s.file_range());
        match plt_sec {
            // Checked: a section header's offset and size are the file's word.
            Some((offset, size)) => sections.push((offset..offset.checked_add(size)?, 0)),
            None => {
                let (offset, size) = elf.section_by_name(".plt")?.file_range()?;
                sections.push((offset.checked_add(ENTRY)?..offset.checked_add(size)?, 0));
            }
        }
        Some(PltNames { sections, names })
    }

    /// `function@plt` for a file offset inside a stub.
    pub fn name(&self, offset: u64) -> Option<String> {
        let (range, first) = self.sections.iter().find(|(range, _)| range.contains(&offset))?;
        let index = first + ((offset - range.start) / ENTRY) as usize;
        self.names.get(index).filter(|name| !name.is_empty()).map(|name| format!("{name}@plt"))
    }
}

#[cfg(test)]
mod tests {
    use std::{path::Path, process::Command};

    use super::*;

    /// objdump's names of the PLT stubs of `path` (its `<puts@plt>:` lines), by file offset.
    fn objdump_stubs(path: &Path) -> Vec<(u64, String)> {
        let data = std::fs::read(path).unwrap();
        let elf = object::File::parse(data.as_slice()).unwrap();
        let to_offset = |address: u64| {
            elf.sections().find_map(|s| {
                let (offset, _) = s.file_range()?;
                (s.address()..s.address() + s.size())
                    .contains(&address)
                    .then(|| address - s.address() + offset)
            })
        };
        let out =
            Command::new("objdump").args(["-d", "-j", ".plt", "-j", ".plt.sec"]).arg(path).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (address, rest) = line.split_once(" <")?;
                let name = rest.strip_suffix(">:")?;
                let address = u64::from_str_radix(address.trim(), 16).ok()?;
                name.ends_with("@plt").then(|| Some((to_offset(address)?, name.to_string())))?
            })
            .collect()
    }

    #[test]
    fn stubs_are_named_as_objdump_names_them() {
        if Command::new("objdump").arg("--version").output().is_err() {
            assert!(std::env::var_os("CI").is_none(), "CI has binutils (objdump) with gcc");
            eprintln!("skipped: no objdump");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("calls.c");
        std::fs::write(
            &source,
            "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\
             int main(int c, char **v) { puts(v[0]); char *p = malloc(c * 16); memset(p, 0, c); \
             printf(\"%d\\n\", atoi(v[0])); free(p); return 0; }\n",
        )
        .unwrap();
        let binary = dir.path().join("calls");
        let built = Command::new("cc").args(["-O1", "-o"]).arg(&binary).arg(&source).status().unwrap();
        assert!(built.success());
        let expected = objdump_stubs(&binary);
        assert!(expected.len() >= 3, "objdump found {expected:?}");
        let data = std::fs::read(&binary).unwrap();
        let names = PltNames::of(&object::File::parse(data.as_slice()).unwrap());
        for (offset, name) in &expected {
            // The stub's first and last byte both belong to it.
            assert_eq!(names.name(*offset).as_deref(), Some(name.as_str()), "at {offset:#x}");
            assert_eq!(names.name(offset + ENTRY - 1).as_deref(), Some(name.as_str()));
        }
    }
}
