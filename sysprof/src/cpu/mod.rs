//! The on-CPU family: sampling every CPU at a frequency, the profile of where the target ran,
//! its hotspots and what they recommend.

pub mod hotspots;
pub mod probes;
pub mod recommend;
pub mod section;

pub use self::{
    hotspots::{Hotspot, ProcessShare},
    probes::CpuSamples,
    section::CpuSection,
};
