//! Unwind tables from a file's call frame information: every row of every FDE of `.eh_frame`
//! (or `.debug_frame` where that is all there is), parsed with gimli and reduced to what the
//! BPF unwinder evaluates (`sysprof_common::unwind::UnwindRow`): where the CFA is, and where
//! the caller's frame pointer was saved. gimli rather than a ready table builder: it is already
//! in sysprof's tree (blazesym reads DWARF with it), reads both sections and every pointer
//! encoding, and the rows' format is the BPF side's own.

use anyhow::Context as _;
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};
use sysprof_common::unwind::{UnwindRow, cfa, rbp};

/// A file's unwind table, and what places its addresses in a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Sorted by `pc`; a gap between FDEs is a row that ends the walk.
    pub rows: Vec<UnwindRow>,
    /// The file's executable loadable segments: (file offset, virtual address).
    pub segments: Vec<(u64, u64)>,
}

/// The page size mappings are aligned to.
const PAGE: u64 = 4096;

impl Table {
    /// What to subtract from an address in a mapping of this file that starts at `start` at
    /// file offset `file_offset`, to get the file's own address; `None` when no executable
    /// segment is mapped there. The loader maps a segment from its offset rounded down to a
    /// page, which may hold the end of the segment before it (lld packs them).
    pub fn bias(&self, start: u64, file_offset: u64) -> Option<u64> {
        let &(_, vaddr) = self.segments.iter().find(|(offset, _)| offset & !(PAGE - 1) == file_offset)?;
        Some(start.wrapping_sub(vaddr & !(PAGE - 1)))
    }
}

/// Everything [`build_from`] reads of a file, copied out of it: the table is a function of
/// these bytes alone, so [`Inputs::key`], their hash, names the table in the cache whoever owns
/// the file it came from, and a file changed under sysprof between the hash and the build
/// (it is mapped, and its owner can write it) changes neither.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inputs {
    /// The executable loadable segments: (file offset, virtual address).
    segments: Vec<(u64, u64)>,
    frame: Frame,
}

/// The call frame information and the addresses its pointers are relative to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Frame {
    Eh { bytes: Vec<u8>, address: u64, text: Option<u64>, got: Option<u64> },
    Debug { bytes: Vec<u8> },
    None,
}

impl Inputs {
    /// Reads them from an ELF file (x86_64 only: the rules are x86_64's registers).
    pub fn read(data: &[u8]) -> anyhow::Result<Self> {
        let file = object::File::parse(data).context("not an ELF file sysprof can read")?;
        if file.architecture() != object::Architecture::X86_64 {
            anyhow::bail!("unwind tables are built for x86_64 code only");
        }
        let segments = file
            .segments()
            .filter(|segment| matches!(segment.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|segment| (segment.file_range().0, segment.address()))
            .collect();
        let frame = if let Some(section) = file.section_by_name(".eh_frame") {
            Frame::Eh {
                bytes: section.data().context("reading .eh_frame")?.to_vec(),
                address: section.address(),
                text: file.section_by_name(".text").map(|text| text.address()),
                got: file.section_by_name(".got").map(|got| got.address()),
            }
        } else if let Some(section) = file.section_by_name(".debug_frame") {
            Frame::Debug { bytes: uncompressed(&section).context("reading .debug_frame")? }
        } else {
            Frame::None
        };
        Ok(Inputs { segments, frame })
    }

    /// SHA-256 of every field, each of fixed width or led by its length, so that no two
    /// different inputs are written alike.
    pub fn key(&self) -> [u8; 32] {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update(b"sysprof unwind inputs 1\0");
        hash.update((self.segments.len() as u64).to_le_bytes());
        for &(offset, vaddr) in &self.segments {
            hash.update(offset.to_le_bytes());
            hash.update(vaddr.to_le_bytes());
        }
        let optional = |hash: &mut sha2::Sha256, value: Option<u64>| match value {
            Some(value) => {
                hash.update([1]);
                hash.update(value.to_le_bytes());
            }
            None => hash.update([0]),
        };
        match &self.frame {
            Frame::Eh { bytes, address, text, got } => {
                hash.update([1]);
                hash.update(address.to_le_bytes());
                optional(&mut hash, *text);
                optional(&mut hash, *got);
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(bytes);
            }
            Frame::Debug { bytes } => {
                hash.update([2]);
                hash.update((bytes.len() as u64).to_le_bytes());
                hash.update(bytes);
            }
            Frame::None => hash.update([0]),
        }
        hash.finalize().into()
    }
}

/// The most of a compressed `.debug_frame` that is decompressed: a file's word for its size
/// is what is allocated, and a few megabytes of zeros compress to a few kilobytes.
const MAX_DECOMPRESSED: u64 = 256 << 20;

/// A section's bytes, decompressed when it is compressed (`-gz=zlib`: debug sections only).
fn uncompressed(section: &object::Section<'_, '_>) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    let compressed = section.compressed_data()?;
    let size = compressed.uncompressed_size;
    match compressed.format {
        object::CompressionFormat::None => Ok(compressed.data.to_vec()),
        object::CompressionFormat::Zlib => {
            anyhow::ensure!(
                size <= MAX_DECOMPRESSED,
                "compressed, of {size} bytes uncompressed: more than the {MAX_DECOMPRESSED} read"
            );
            let mut bytes = Vec::with_capacity(size as usize);
            flate2::read::ZlibDecoder::new(compressed.data).take(size).read_to_end(&mut bytes)?;
            anyhow::ensure!(bytes.len() as u64 == size, "compressed, and shorter than its header says");
            Ok(bytes)
        }
        format => anyhow::bail!("compressed as {format:?}, which sysprof does not read"),
    }
}

/// Builds the table of an ELF file (x86_64 only: the rules are x86_64's registers).
pub fn build(data: &[u8]) -> anyhow::Result<Table> {
    build_from(&Inputs::read(data)?)
}

/// Builds the table of the file `inputs` were read from.
pub fn build_from(inputs: &Inputs) -> anyhow::Result<Table> {
    let mut spans = Vec::new();
    match &inputs.frame {
        Frame::Eh { bytes, address, text, got } => {
            let mut bases = BaseAddresses::default().set_eh_frame(*address);
            if let Some(text) = text {
                bases = bases.set_text(*text);
            }
            if let Some(got) = got {
                bases = bases.set_got(*got);
            }
            collect(&EhFrame::new(bytes, LittleEndian), &bases, &mut spans)?;
        }
        Frame::Debug { bytes } => {
            let mut frame = DebugFrame::new(bytes, LittleEndian);
            frame.set_address_size(8);
            collect(&frame, &BaseAddresses::default(), &mut spans)?;
        }
        Frame::None => {}
    }
    Ok(Table { rows: rows_of(spans), segments: inputs.segments.clone() })
}

/// One row's span of addresses and its rule. In 32 bits, as the BPF side keeps them: a
/// compiler's table has half a million spans, and at 32 bytes each (with 64-bit addresses)
/// they and the rows made of them were 27 MB of sysprof's heap while it built the table.
struct Span {
    start: u32,
    end: u32,
    row: UnwindRow,
}

/// Every row of every FDE of `section`.
fn collect<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>>(
    section: &S,
    bases: &BaseAddresses,
    spans: &mut Vec<Span>,
) -> anyhow::Result<()>
where
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut context = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().context("reading the call frame information")? {
        let CieOrFde::Fde(partial) = entry else { continue };
        // A broken entry costs its function, not the file.
        let Ok(fde) = partial.parse(S::cie_from_offset) else { continue };
        let signal = fde.is_signal_trampoline();
        let Ok(mut table) = fde.rows(section, bases, &mut context) else { continue };
        while let Ok(Some(row)) = table.next_row() {
            if row.start_address() >= row.end_address() {
                continue;
            }
            let rule = if signal {
                UnwindRow { cfa: cfa::END, ..UnwindRow::default() }
            } else {
                rule_of(section, row)
            };
            let start =
                u32::try_from(row.start_address()).context("code above 4 GiB in the file's addresses")?;
            let end = u32::try_from(row.end_address()).unwrap_or(u32::MAX);
            // A row at 4 GiB - 1 whose end is cut off covers nothing in 32 bits (kept, its
            // start and the walk's end would be two rows at one address).
            if start < end {
                spans.push(Span { start, end, row: rule });
            }
        }
    }
    Ok(())
}

/// The BPF side's rule for one row.
fn rule_of<'a, S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
) -> UnwindRow {
    let end = UnwindRow { cfa: cfa::END, ..UnwindRow::default() };
    let frame_pointer = UnwindRow { cfa: cfa::FRAME_POINTER, ..UnwindRow::default() };
    // The return address: always at CFA - 8 on x86_64; undefined in the outermost frame.
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) | None => return end,
        Some(_) => return frame_pointer,
    }
    let (kind, offset, mut rbp_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RSP => (cfa::RSP, *offset, 0),
        CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBP => (cfa::RBP, *offset, 0),
        CfaRule::RegisterAndOffset { .. } => return frame_pointer,
        CfaRule::Expression(expression) => {
            let Ok(expression) = expression.get(section) else { return frame_pointer };
            match known_expression(expression.0.slice()) {
                Some(known) => known,
                None => return frame_pointer,
            }
        }
    };
    let Ok(offset) = i32::try_from(offset) else { return frame_pointer };
    let mut rbp_kind = rbp::UNCHANGED;
    if kind != cfa::PLT
        && let Some(RegisterRule::Offset(saved)) = row.register(X86_64::RBP)
        && let Ok(saved) = i16::try_from(saved)
    {
        rbp_kind = rbp::SAVED;
        rbp_offset = saved;
    }
    UnwindRow { pc: 0, cfa_offset: offset, rbp_offset, cfa: kind, rbp: rbp_kind }
}

const DW_OP_BREG6: u8 = 0x76;
const DW_OP_BREG7: u8 = 0x77;
const DW_OP_DEREF: u8 = 0x06;

/// The two CFA expressions compilers emit for x86_64 user code: the PLT stub's
/// (`rsp + N + ((rip & 15) >= K) << 3`) and a realigned stack's (`*(rbp + N)`). Returns the
/// kind, its offset and (for the PLT) the threshold K.
fn known_expression(bytes: &[u8]) -> Option<(u8, i64, i16)> {
    let (&op, rest) = bytes.split_first()?;
    let (offset, rest) = sleb128(rest)?;
    match op {
        // DW_OP_breg16 0, lit15, and, litK, ge, lit3, shl, plus
        DW_OP_BREG7 => match rest {
            [0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22] if (0x30..=0x3f).contains(lit) => {
                Some((cfa::PLT, offset, i16::from(lit - 0x30)))
            }
            _ => None,
        },
        DW_OP_BREG6 if rest == [DW_OP_DEREF] => Some((cfa::RBP_DEREF, offset, 0)),
        _ => None,
    }
}

fn sleb128(bytes: &[u8]) -> Option<(i64, &[u8])> {
    let mut reader = gimli::EndianSlice::new(bytes, LittleEndian);
    let value = gimli::Reader::read_sleb128(&mut reader).ok()?;
    Some((value, reader.slice()))
}

/// The spans as sorted rows: neighbours with the same rule merged, a gap between FDEs marked
/// with a row that ends the walk.
fn rows_of(mut spans: Vec<Span>) -> Vec<UnwindRow> {
    spans.sort_by_key(|span| span.start);
    // A row for each span, one for each gap between them and one for the end, at most: sized
    // once, as a vector that outgrew its first size doubled (5 MB more for a compiler).
    let mut covered_to = 0u32;
    let mut gaps = 0;
    for span in &spans {
        gaps += usize::from(covered_to != 0 && covered_to < span.start);
        covered_to = covered_to.max(span.end);
    }
    let mut rows: Vec<UnwindRow> = Vec::with_capacity(spans.len() + gaps + 1);
    let mut covered_to = 0u32;
    for span in spans {
        let pc = span.start;
        if !rows.is_empty() && covered_to < span.start {
            rows.push(UnwindRow { pc: covered_to, cfa: cfa::END, ..UnwindRow::default() });
        }
        let row = UnwindRow { pc, ..span.row };
        match rows.last_mut() {
            // Same rule as the row before: one row covers both.
            Some(last) if UnwindRow { pc: last.pc, ..row } == *last => {}
            // Same start (overlapping FDEs): the later one wins.
            Some(last) if last.pc == pc => *last = row,
            _ => rows.push(row),
        }
        covered_to = covered_to.max(span.end);
    }
    if !rows.is_empty() {
        rows.push(UnwindRow { pc: covered_to, cfa: cfa::END, ..UnwindRow::default() });
    }
    rows
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn reads_the_plt_and_realigned_stack_expressions() {
        // rsp + 8 + ((rip & 15) >= 11) << 3, as ld writes it for .plt.
        let plt = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];
        assert_eq!(known_expression(&plt), Some((cfa::PLT, 8, 11)));
        // *(rbp - 8), gcc's DRAP.
        assert_eq!(known_expression(&[0x76, 0x78, 0x06]), Some((cfa::RBP_DEREF, -8, 0)));
        assert_eq!(known_expression(&[0x76, 0x78]), None);
    }

    #[test]
    fn gaps_end_the_walk_and_equal_neighbours_merge() {
        let rsp = |offset| UnwindRow { cfa: cfa::RSP, cfa_offset: offset, ..UnwindRow::default() };
        let spans = vec![
            Span { start: 0x1010, end: 0x1020, row: rsp(16) },
            Span { start: 0x1000, end: 0x1010, row: rsp(8) },
            Span { start: 0x1020, end: 0x1030, row: rsp(16) },
            Span { start: 0x1100, end: 0x1110, row: rsp(8) },
        ];
        let rows = rows_of(spans);
        let summary: Vec<(u32, u8, i32)> = rows.iter().map(|row| (row.pc, row.cfa, row.cfa_offset)).collect();
        assert_eq!(
            summary,
            [
                (0x1000, cfa::RSP, 8),
                (0x1010, cfa::RSP, 16),
                (0x1030, cfa::END, 0),
                (0x1100, cfa::RSP, 8),
                (0x1110, cfa::END, 0)
            ]
        );
    }

    #[test]
    fn the_key_is_of_what_builds_the_table_and_nothing_else() {
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let inputs = Inputs::read(&data).unwrap();
        assert_eq!(build_from(&inputs).unwrap(), build(&data).unwrap());
        let file = object::File::parse(&*data).unwrap();
        let range = |name: &str| {
            let (start, size) = file.section_by_name(name).unwrap().file_range().unwrap();
            start as usize..(start + size) as usize
        };
        // Its build id is none of the inputs: another build id, the same key.
        let mut renamed = data.clone();
        renamed[range(".note.gnu.build-id")].iter_mut().rev().take(4).for_each(|byte| *byte ^= 0xff);
        assert_eq!(Inputs::read(&renamed).unwrap().key(), inputs.key());
        // The same build id and size with the call frame information gone: another key (and
        // the table it names is empty).
        let mut emptied = data.clone();
        emptied[range(".eh_frame")].fill(0);
        let emptied = Inputs::read(&emptied).unwrap();
        assert_ne!(emptied.key(), inputs.key());
        assert!(build_from(&emptied).unwrap().rows.is_empty());
        // A base address moved: another key.
        let mut moved = inputs.clone();
        if let Frame::Eh { address, .. } = &mut moved.frame {
            *address += 16;
        }
        assert_ne!(moved.key(), inputs.key());
    }

    /// `-gz=zlib`'s `.debug_frame` (in a file without `.eh_frame`), and one whose header
    /// claims more than is decompressed.
    #[test]
    fn a_compressed_debug_frame_is_read_within_a_bound() {
        let seed =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/eh_frame/calls-debug-frame-zlib");
        let data = std::fs::read(&seed).unwrap();
        let table = build(&data).unwrap();
        assert!(table.rows.len() > 4, "{} rows", table.rows.len());
        let file = object::File::parse(&*data).unwrap();
        let (offset, _) = file.section_by_name(".debug_frame").unwrap().file_range().unwrap();
        // Elf64_Chdr: ch_type, ch_reserved, then ch_size.
        let mut claims = data.clone();
        claims[offset as usize + 8..offset as usize + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let error = build(&claims).unwrap_err();
        assert!(format!("{error:#}").contains("more than the 268435456 read"), "{error:#}");
    }

    #[test]
    fn its_own_binary_has_a_table_for_its_own_code() {
        let path = std::env::current_exe().unwrap();
        let data = std::fs::read(&path).unwrap();
        let table = build(&data).unwrap();
        assert!(table.rows.len() > 1000, "{} rows", table.rows.len());
        assert!(table.rows.windows(2).all(|pair| pair[0].pc < pair[1].pc), "rows sorted and distinct");
        // This very function's address (the test binary is position-independent): covered
        // by a row with a CFA rule from the stack pointer.
        let here = its_own_binary_has_a_table_for_its_own_code as *const () as u64;
        let maps = crate::procmaps::ProcessMaps::read(std::process::id()).unwrap();
        let mapping = maps.find(here).unwrap();
        let bias = table.bias(mapping.start, mapping.file_offset).unwrap();
        let address = (here - bias) as u32;
        let row = table.rows[table.rows.partition_point(|row| row.pc <= address) - 1];
        assert_eq!(row.cfa, cfa::RSP, "{row:?}");
        assert_eq!(row.cfa_offset, 8, "at a function's first instruction the CFA is rsp + 8: {row:?}");
    }
}
