//! The on-CPU family's kernel side: the sampling program on every CPU, and the read-out of the
//! sample counts with their stacks.

use std::collections::{BTreeSet, HashMap};

use aya::programs::{
    PerfEvent,
    perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
};
use sysprof_common::{SampleKey, names};

use crate::{
    config::SampleEvent,
    family::{Analysis, Family},
    probes::{
        AttachedProbe, Preload, Probes, cpu_ranges, online_cpus, perf_event_error, program_mut, rejected,
    },
    record::reader::MapReader,
    report::Section,
};

/// Raw on-CPU samples as the kernel aggregated them, with the stacks they reference.
#[derive(Debug, Default)]
pub struct CpuSamples {
    pub counts: Vec<(SampleKey, u64)>,
    /// Stack id -> instruction pointers, innermost first.
    pub stacks: HashMap<u32, Vec<u64>>,
}

/// The on-CPU family: sampling on every CPU. It is always in the report (a run that did not
/// sample says so in its section); it samples only when `sampled`.
pub(crate) struct CpuFamily {
    pub event: SampleEvent,
    pub frequency_hz: u64,
    pub sampled: bool,
    samples: CpuSamples,
}

impl CpuFamily {
    pub(crate) fn new(event: SampleEvent, frequency_hz: u64, sampled: bool) -> Self {
        CpuFamily { event, frequency_hz, sampled, samples: CpuSamples::default() }
    }
}

impl Family for CpuFamily {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn programs(&self) -> &'static [Preload] {
        match self.sampled {
            true => &[Preload::Plain("cpu_sample")],
            false => &[],
        }
    }

    fn attach(&self, probes: &mut Probes) -> anyhow::Result<()> {
        match self.sampled {
            true => probes.attach_cpu_sampling(self.event, self.frequency_hz),
            false => Ok(()),
        }
    }

    fn read(&mut self, maps: &mut MapReader<'_>) -> anyhow::Result<()> {
        self.samples = CpuSamples::read(maps)?;
        Ok(())
    }

    fn processes(&self) -> Vec<u32> {
        self.samples.counts.iter().map(|(key, _)| key.tgid).collect()
    }

    fn analyze(&mut self, cx: &mut Analysis<'_>) -> anyhow::Result<Option<Box<dyn Section>>> {
        Ok(Some(Box::new(super::section::analyze(&self.samples, self.sampled, cx))))
    }
}

impl Probes {
    /// Attaches on-CPU sampling to every online CPU at `frequency_hz`.
    pub fn attach_cpu_sampling(&mut self, event: SampleEvent, frequency_hz: u64) -> anyhow::Result<()> {
        const PROGRAM: &str = "cpu_sample";
        let cpus = online_cpus()?;
        let program: &mut PerfEvent = program_mut(&mut self.ebpf, PROGRAM)?.try_into()?;
        if program.fd().is_err() {
            program.load().map_err(|e| rejected(PROGRAM, e))?;
        }
        let perf_config = match event {
            SampleEvent::CpuClock => PerfEventConfig::Software(SoftwareEvent::CpuClock),
            SampleEvent::Cycles => PerfEventConfig::Hardware(HardwareEvent::CpuCycles),
        };
        for &cpu in &cpus {
            program
                .attach(
                    perf_config,
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(frequency_hz),
                    false,
                )
                .map_err(|e| perf_event_error(&event.to_string(), e))?;
        }
        let program_id = program.info()?.id();
        self.attached.push(AttachedProbe {
            program: PROGRAM.into(),
            kind: "perf_event".into(),
            attached_to: format!("{event} at {frequency_hz} Hz on CPUs {}", cpu_ranges(&cpus)),
            links: cpus.len() as u32,
            program_id,
        });
        Ok(())
    }
}

impl CpuSamples {
    /// Reads the on-CPU sample counts and every stack they reference.
    pub(crate) fn read(maps: &mut MapReader<'_>) -> anyhow::Result<Self> {
        let counts: Vec<(SampleKey, u64)> = maps.entries(names::CPU_SAMPLES)?;
        let ids: BTreeSet<u32> = counts
            .iter()
            .flat_map(|(key, _)| [key.user_stack_id, key.kernel_stack_id])
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
        let stacks = maps.stacks(names::CPU_STACKS, &ids)?;
        Ok(CpuSamples { counts, stacks })
    }
}
