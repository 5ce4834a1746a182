//! Code objects read out of a live CPython process (`process_vm_readv`): the function's name,
//! its file and its line table, decoded once into (instruction range -> line) spans so a
//! frame's line is a lookup, and kept after the process or the code object is gone.

use std::collections::{BTreeMap, HashMap};

use super::layout::CodeLayout;

/// What a frame needs of its code object.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Code {
    /// `co_qualname` where the version has it (`Model.forward`), else `co_name`.
    pub name: String,
    /// `co_filename` as the interpreter has it.
    pub file: String,
    pub first_line: u32,
    /// (first code unit, line) at each change of line, in order; a line of 0 is "none".
    pub lines: Vec<(u32, u32)>,
}

impl Code {
    /// The line of the instruction at `offset` (in code units).
    pub fn line_at(&self, offset: u32) -> u32 {
        let index = self.lines.partition_point(|&(start, _)| start <= offset);
        match index.checked_sub(1).map(|i| self.lines[i].1) {
            Some(line) if line > 0 => line,
            _ => self.first_line,
        }
    }
}

/// The code objects of one process, by address. A code object freed during the trace leaves
/// its address to the next, so each address keeps every code object seen there, from the
/// stack on which it was first seen; a stack's frames read the code objects of its time.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessCode {
    pub version: (u8, u8),
    /// Address -> (first stack seen at, what was there then), in order.
    pub code: BTreeMap<u64, Vec<(u64, Seen)>>,
    /// Stack id -> when its code objects were read (a count of the stacks read).
    pub stacks: HashMap<u32, u64>,
    pub read: u64,
}

/// A code object, with what tells it from the next one at its address.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Seen {
    pub signature: u64,
    pub code: Code,
}

impl ProcessCode {
    /// The code object a frame of stack `stack` ran.
    pub fn lookup(&self, stack: u32, address: u64) -> Option<&Code> {
        let when = self.stacks.get(&stack).copied().unwrap_or(u64::MAX);
        let versions = self.code.get(&address)?;
        let at = versions.partition_point(|(since, _)| *since <= when).max(1);
        versions.get(at - 1).map(|(_, seen)| &seen.code)
    }

    /// Reads the code objects of a new stack's frames: those not seen at their address before,
    /// or not the one seen there last. Returns how many it read, and how many frames held no
    /// code object by then.
    pub fn read_stack(
        &mut self,
        stack: u32,
        addresses: impl Iterator<Item = u64>,
        memory: &impl ReadMemory,
        object: &CodeObjects,
    ) -> (usize, usize) {
        self.read += 1;
        let now = self.read;
        self.stacks.insert(stack, now);
        let (mut read, mut unreadable) = (0, 0);
        for address in addresses {
            let Some(signature) = memory.signature(address, object) else {
                unreadable += 1;
                continue;
            };
            let known = self.code.get(&address).and_then(|versions| versions.last());
            if known.is_some_and(|(_, seen)| seen.signature == signature) {
                continue;
            }
            match memory.code(address, object) {
                Some(code) => {
                    self.code.entry(address).or_default().push((now, Seen { signature, code }));
                    read += 1;
                }
                None => unreadable += 1,
            }
        }
        (read, unreadable)
    }
}

/// How to read the code objects of one interpreter.
#[derive(Clone, Copy, Debug)]
pub struct CodeObjects {
    /// `PyCode_Type`'s address in the process.
    pub code_type: u64,
    pub layout: CodeLayout,
    pub version: (u8, u8),
}

/// Reads one process's memory.
pub struct Memory {
    pid: libc::pid_t,
}

impl Memory {
    pub fn of(pid: u32) -> Self {
        Memory { pid: pid as libc::pid_t }
    }
}

impl ReadMemory for Memory {
    fn read(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        let mut buffer = vec![0u8; len];
        let local = libc::iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: len };
        let remote = libc::iovec { iov_base: address as *mut libc::c_void, iov_len: len };
        // SAFETY: the local iovec is `buffer`, which outlives the call; the remote one is only
        // read by the kernel, which checks it.
        let read = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        (read == len as isize).then_some(buffer)
    }
}

/// Bytes standing for a process's memory from `base` on: what the fuzz target
/// (`fuzzing::python_code`) reads code objects from.
pub struct Image<'a> {
    pub base: u64,
    pub bytes: &'a [u8],
}

impl ReadMemory for Image<'_> {
    fn read(&self, address: u64, len: usize) -> Option<Vec<u8>> {
        let start = usize::try_from(address.checked_sub(self.base)?).ok()?;
        self.bytes.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
    }
}

/// Reads code objects out of a process's memory: every read goes through `read`, the
/// decoding is the same whatever reads it.
pub trait ReadMemory {
    /// `len` bytes at `address`, all of them or none.
    fn read(&self, address: u64, len: usize) -> Option<Vec<u8>>;

    fn u64_at(&self, address: u64) -> Option<u64> {
        Some(u64::from_le_bytes(self.read(address, 8)?.try_into().ok()?))
    }

    /// A `str` object's text (compact strings: every name and file name is one).
    fn string(&self, object: u64, layout: &CodeLayout) -> Option<String> {
        const MAX_CHARS: u64 = 4096;
        // ob_refcnt, ob_type, length, hash, then the state bits.
        let head = self.read(object, 40)?;
        if !live(&head) {
            return None;
        }
        let length = u64::from_le_bytes(head[16..24].try_into().ok()?).min(MAX_CHARS);
        let state = u32::from_le_bytes(head[32..36].try_into().ok()?);
        let (kind, compact, ascii) = ((state >> 2) & 7, state >> 5 & 1 == 1, state >> 6 & 1 == 1);
        if !compact {
            return None;
        }
        if ascii {
            let bytes = self.read(object.checked_add(layout.ascii_header)?, length as usize)?;
            return String::from_utf8(bytes).ok().filter(|text| !text.chars().any(char::is_control));
        }
        let data =
            self.read(object.checked_add(layout.compact_header)?, (length * u64::from(kind)) as usize)?;
        let chars: Vec<u32> = match kind {
            1 => data.iter().map(|&b| u32::from(b)).collect(),
            2 => data.as_chunks::<2>().0.iter().map(|&c| u32::from(u16::from_le_bytes(c))).collect(),
            4 => data.as_chunks::<4>().0.iter().map(|&c| u32::from_le_bytes(c)).collect(),
            _ => return None,
        };
        let text: String = chars.into_iter().map(|c| char::from_u32(c).unwrap_or('\u{fffd}')).collect();
        (!text.chars().any(char::is_control)).then_some(text)
    }

    /// A `bytes` object's contents.
    fn bytes(&self, object: u64) -> Option<Vec<u8>> {
        const MAX_BYTES: u64 = 1 << 20;
        let size = self.u64_at(object.checked_add(16)?)?.min(MAX_BYTES);
        self.read(object.checked_add(32)?, size as usize)
    }

    /// What tells the code object at `address` from another one there later: its name,
    /// file and line table objects and its first line; `None` if it is no code object.
    fn signature(&self, address: u64, object: &CodeObjects) -> Option<u64> {
        use std::hash::{Hash as _, Hasher as _};
        let layout = &object.layout;
        let fields =
            [layout.name, layout.qualname.unwrap_or(layout.name), layout.filename, layout.line_table];
        // Every field's word, and the type's (at 8).
        let len = fields.iter().chain([&layout.first_line, &8]).max().copied().unwrap_or(0) + 8;
        let head = self.read(address, len as usize)?;
        let word = |at: u64| {
            let bytes = head.get(at as usize..).and_then(|rest| rest.first_chunk::<8>());
            bytes.map_or(0, |bytes| u64::from_le_bytes(*bytes))
        };
        if word(8) != object.code_type || !live(&head) {
            return None;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        fields.iter().map(|&at| word(at)).for_each(|value| value.hash(&mut hasher));
        (word(layout.first_line) as u32).hash(&mut hasher);
        Some(hasher.finish())
    }

    /// The code object at `address`, if it is one (its type is `code_type`).
    fn code(&self, address: u64, object: &CodeObjects) -> Option<Code> {
        let (layout, version) = (&object.layout, object.version);
        // Checked: the addresses are the process's word (an address past the end of its
        // address space is no object).
        let field = |offset: u64| address.checked_add(offset);
        if self.u64_at(field(8)?)? != object.code_type {
            return None;
        }
        let name_field = layout.qualname.unwrap_or(layout.name);
        let name = self.string(self.u64_at(field(name_field)?)?, layout)?;
        let file = self.string(self.u64_at(field(layout.filename)?)?, layout)?;
        let first_line = u32::from_le_bytes(self.read(field(layout.first_line)?, 4)?.try_into().ok()?);
        let table = self.bytes(self.u64_at(field(layout.line_table)?)?).unwrap_or_default();
        let lines = if version >= (3, 11) {
            locations(&table, first_line)
        } else {
            line_table_3_10(&table, first_line)
        };
        Some(Code { name, file, first_line, lines })
    }
}

/// Whether an object's header is a live object's: a freed one's first word (its reference
/// count) is the allocator's free-list link, an address, while its type may still be there.
fn live(head: &[u8]) -> bool {
    let refcount = head.get(..8).map_or(0, |word| u64::from_le_bytes(word.try_into().unwrap_or_default()));
    // Immortal objects (3.12+) count 2^32 - 1 or 3 << 30; no real count comes near 2^40.
    (1..1 << 40).contains(&refcount)
}

/// 3.10's `co_linetable`: (bytes advanced, line delta) pairs, a delta of -128 meaning no line.
fn line_table_3_10(table: &[u8], first_line: u32) -> Vec<(u32, u32)> {
    let (mut start, mut line) = (0u32, i64::from(first_line));
    let mut spans = Vec::new();
    for pair in table.as_chunks::<2>().0 {
        let (advance, delta) = (u32::from(pair[0]), pair[1] as i8);
        let shown = if delta == -128 {
            0
        } else {
            line += i64::from(delta);
            line.max(0) as u32
        };
        if advance > 0 {
            // Byte offsets: two bytes a code unit.
            spans.push((start / 2, shown));
        }
        start += advance;
    }
    spans
}

/// 3.11+'s location table (Objects/locations.md): entries of 1-8 code units, each with a line
/// delta in one of five forms.
fn locations(table: &[u8], first_line: u32) -> Vec<(u32, u32)> {
    let mut bytes = table.iter().copied().peekable();
    let (mut unit, mut line) = (0u32, i64::from(first_line));
    let mut spans = Vec::new();
    while let Some(first) = bytes.next() {
        if first & 0x80 == 0 {
            continue;
        }
        let code = (first >> 3) & 15;
        let length = u32::from(first & 7) + 1;
        let mut varint = || {
            let (mut value, mut shift) = (0u64, 0);
            while let Some(byte) = bytes.next_if(|_| shift < 64) {
                value |= u64::from(byte & 63) << shift;
                shift += 6;
                if byte & 64 == 0 {
                    break;
                }
            }
            value
        };
        let signed = |value: u64| if value & 1 == 1 { -((value >> 1) as i64) } else { (value >> 1) as i64 };
        // Saturating: a table read from memory the process has since reused is garbage, and a
        // garbage delta must not overflow (it gives a wrong line, never a crash).
        let shown = match code {
            15 => None,
            14 => {
                line = line.saturating_add(signed(varint()));
                for _ in 0..3 {
                    varint();
                }
                Some(line)
            }
            13 => {
                line = line.saturating_add(signed(varint()));
                Some(line)
            }
            10..=12 => {
                line = line.saturating_add(i64::from(code - 10));
                bytes.next();
                bytes.next();
                Some(line)
            }
            _ => {
                bytes.next();
                Some(line)
            }
        };
        spans.push((unit, shown.map_or(0, |line| line.clamp(0, i64::from(u32::MAX)) as u32)));
        unit = unit.saturating_add(length);
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(spans: Vec<(u32, u32)>, first_line: u32, offset: u32) -> u32 {
        Code { name: String::new(), file: String::new(), first_line, lines: spans }.line_at(offset)
    }

    #[test]
    fn a_3_10_line_table_gives_each_instruction_its_line() {
        // Bytes 0-5 on the first line, 6-9 two lines on, 10-11 with no line, 12-15 one on.
        let table = [6, 0, 4, 2, 2, 0x80, 4, 0xff];
        let spans = line_table_3_10(&table, 10);
        assert_eq!(line(spans.clone(), 10, 0), 10);
        assert_eq!(line(spans.clone(), 10, 2), 10);
        assert_eq!(line(spans.clone(), 10, 3), 12);
        assert_eq!(line(spans.clone(), 10, 6), 11);
    }

    #[test]
    fn a_location_table_gives_each_instruction_its_line() {
        // One unit with no column on line +1 (form 13, delta 2 -> +1), two units one line on
        // (form 11, two column bytes), one unit long form -3 (delta 7), one with no location.
        let table = [0x80 | 13 << 3, 2, 0x80 | 11 << 3 | 1, 0, 4, 0x80 | 14 << 3, 7, 0, 1, 1, 0x80 | 15 << 3];
        let spans = locations(&table, 20);
        assert_eq!(line(spans.clone(), 20, 0), 21);
        assert_eq!(line(spans.clone(), 20, 1), 22);
        assert_eq!(line(spans.clone(), 20, 2), 22);
        assert_eq!(line(spans.clone(), 20, 3), 19);
        assert_eq!(line(spans, 20, 4), 20);
    }

    #[test]
    fn a_garbage_location_table_gives_wrong_lines_not_a_crash() {
        // Memory a process reused after freeing the code object: long-form deltas near 2^62,
        // the same sign twice, would overflow the line (a panic in a debug build).
        let huge = [0x80 | 13 << 3, 0x7e, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x3f];
        let table: Vec<u8> = huge.iter().chain(&huge).chain(&huge).copied().collect();
        let spans = locations(&table, 1);
        assert_eq!(spans.len(), 3);
        assert!(spans.iter().all(|&(_, line)| line == 0 || line == u32::MAX));
    }
}
