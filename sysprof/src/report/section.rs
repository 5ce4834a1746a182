//! One family's part of the report: its entries in report.json and its part of report.md. The
//! report holds the sections of the families that ran, in the order of the one list of families
//! (`family/list.rs`), and knows none of their types.

use std::{any::Any, fmt::Debug};

/// A family's section of the report.
pub trait Section: Any + Debug + Send + Sync {
    /// Its top-level entries in report.json: usually one key, the family's (the CPU family has
    /// two, `processes` and `hotspots`).
    fn json(&self) -> Vec<(&'static str, &dyn erased_serde::Serialize)>;

    /// Its part of report.md (`output::markdown` has the tables and escaping it writes with).
    fn markdown(&self, out: &mut String);

    /// The seconds the target's threads were busy (on a CPU, or held up: waiting for a CPU, a
    /// lock, the disk), when this section knows: the time a pid's or a system-wide trace's
    /// recommendations are shares of. The largest any section gives is taken.
    fn busy_s(&self) -> Option<f64> {
        None
    }
}

/// The sections of one report, in report order.
#[derive(Debug, Default)]
pub struct Sections(Vec<Box<dyn Section>>);

impl Sections {
    pub fn new(sections: Vec<Box<dyn Section>>) -> Self {
        Sections(sections)
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Section> {
        self.0.iter().map(|section| section.as_ref())
    }

    /// The section of type `T`, when its family ran: what one family's analysis reads of
    /// another's (memory reads the GPU's transfers).
    pub fn get<T: Section>(&self) -> Option<&T> {
        self.0.iter().find_map(|section| (section.as_ref() as &dyn Any).downcast_ref::<T>())
    }

    pub(crate) fn push(&mut self, section: Box<dyn Section>) {
        self.0.push(section);
    }

    pub(crate) fn into_vec(self) -> Vec<Box<dyn Section>> {
        self.0
    }
}
