//! Probed functions that call each other (realloc calling malloc, cudaMemcpy calling
//! cuMemcpyHtoD): only the outermost call of a thread counts.

/// The probed calls open on a thread.
#[repr(C)]
pub struct Nesting {
    /// Stack pointer at the outermost call's entry: a nested call runs below it.
    entry_sp: u64,
    depth: u32,
    _pad: u32,
}

impl Nesting {
    /// A probed call entered with stack pointer `sp`; true when it is the outermost.
    #[inline(always)]
    pub fn enter(&mut self, sp: u64) -> bool {
        // An open call whose frame is not above this one returned unseen (its return probe was
        // not yet attached, or it left by longjmp): start afresh rather than stay "nested".
        if self.depth > 0 && sp >= self.entry_sp {
            self.depth = 0;
        }
        self.depth += 1;
        if self.depth > 1 {
            return false;
        }
        self.entry_sp = sp;
        true
    }

    /// A probed call returned; true when it was the outermost (false also for a return whose
    /// entry was never seen).
    #[inline(always)]
    pub fn leave(&mut self) -> bool {
        if self.depth == 0 {
            return false;
        }
        self.depth -= 1;
        self.depth == 0
    }

    /// Whether a probed call is open.
    #[inline(always)]
    pub fn inside(&self) -> bool {
        self.depth > 0
    }
}
