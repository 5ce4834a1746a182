//! GPU topology: how each pair of devices is connected (NVLink, the same PCIe switch, a host
//! bridge, across sockets), as `nvidia-smi topo -m` shows it, and each link's peak bandwidth,
//! so that measured throughput can be held against it.

use std::fmt::Write as _;

use nvml_wrapper::{Nvml, enum_wrappers::device::TopologyLevel};
use serde::Serialize;

/// Links per device NVML can report.
const MAX_NVLINKS: u32 = 18;

/// One GPU and its links.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub bus_id: String,
    pub memory_total: u64,
    pub pcie_gen: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_max_gen: Option<u32>,
    pub pcie_max_width: Option<u32>,
    /// Per direction, at the current generation and width.
    pub pcie_peak_gb_s: Option<f64>,
    pub nvlinks: Vec<NvLink>,
    /// Per direction, all active links together.
    pub nvlink_peak_gb_s: f64,
}

/// One active NVLink.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct NvLink {
    pub link: u32,
    pub version: Option<u32>,
    /// The PCI bus id of the GPU (or switch) at the other end.
    pub remote_bus_id: Option<String>,
}

/// All GPUs, and the connection of every pair (`matrix[i][j]`: X, NV#, PIX, PXB, PHB, NODE, SYS).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Topology {
    pub devices: Vec<DeviceInfo>,
    pub matrix: Vec<Vec<String>>,
}

/// PCIe bandwidth per lane per direction, GB/s, by generation (after encoding).
pub fn pcie_lane_gb_s(generation: u32) -> Option<f64> {
    Some(match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    })
}

/// NVLink bandwidth per link per direction, GB/s, by version.
pub fn nvlink_gb_s(version: u32) -> f64 {
    match version {
        1 => 20.0,
        2..=4 => 25.0,
        _ => 50.0,
    }
}

/// Reads the topology from NVML.
pub fn read(nvml: &Nvml) -> Topology {
    let count = nvml.device_count().unwrap_or(0);
    let mut devices = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else { continue };
        let pcie_gen = device.current_pcie_link_gen().ok();
        let pcie_width = device.current_pcie_link_width().ok();
        let nvlinks: Vec<NvLink> = (0..MAX_NVLINKS)
            .filter_map(|link| {
                let wrapper = device.link_wrapper_for(link);
                wrapper.is_active().ok().filter(|active| *active)?;
                Some(NvLink {
                    link,
                    version: wrapper.version().ok(),
                    remote_bus_id: wrapper.remote_pci_info().ok().map(|pci| pci.bus_id),
                })
            })
            .collect();
        devices.push(DeviceInfo {
            index,
            name: device.name().unwrap_or_else(|_| "unknown GPU".into()),
            uuid: device.uuid().unwrap_or_default(),
            bus_id: device.pci_info().map(|pci| pci.bus_id).unwrap_or_default(),
            memory_total: device.memory_info().map(|m| m.total).unwrap_or(0),
            pcie_gen,
            pcie_width,
            pcie_max_gen: device.max_pcie_link_gen().ok(),
            pcie_max_width: device.max_pcie_link_width().ok(),
            pcie_peak_gb_s: pcie_gen
                .and_then(pcie_lane_gb_s)
                .zip(pcie_width)
                .map(|(lane, width)| lane * f64::from(width)),
            nvlink_peak_gb_s: nvlinks.iter().map(|l| nvlink_gb_s(l.version.unwrap_or(4))).sum(),
            nvlinks,
        });
    }
    let matrix = devices
        .iter()
        .map(|a| {
            devices
                .iter()
                .map(|b| {
                    if a.index == b.index {
                        return "X".to_string();
                    }
                    let links = a
                        .nvlinks
                        .iter()
                        .filter(|l| l.remote_bus_id.as_deref() == Some(b.bus_id.as_str()))
                        .count();
                    if links > 0 {
                        return format!("NV{links}");
                    }
                    let (Ok(da), Ok(db)) = (nvml.device_by_index(a.index), nvml.device_by_index(b.index))
                    else {
                        return "?".into();
                    };
                    match da.topology_common_ancestor(db) {
                        Ok(TopologyLevel::Internal) => "X".into(),
                        Ok(TopologyLevel::Single) => "PIX".into(),
                        Ok(TopologyLevel::Multiple) => "PXB".into(),
                        Ok(TopologyLevel::HostBridge) => "PHB".into(),
                        Ok(TopologyLevel::Node) => "NODE".into(),
                        Ok(TopologyLevel::System) => "SYS".into(),
                        Err(_) => "?".into(),
                    }
                })
                .collect()
        })
        .collect();
    Topology { devices, matrix }
}

/// The topology as `sysprof topo` prints it.
pub fn render(topology: &Topology) -> String {
    let mut out = String::new();
    let header: Vec<String> = topology.devices.iter().map(|d| format!("GPU{}", d.index)).collect();
    let _ = writeln!(out, "{:<6} {}", "", header.iter().map(|h| format!("{h:<6}")).collect::<String>());
    for (device, row) in topology.devices.iter().zip(&topology.matrix) {
        let cells: String = row.iter().map(|c| format!("{c:<6}")).collect();
        let _ = writeln!(out, "GPU{:<3} {cells}", device.index);
    }
    let _ = writeln!(
        out,
        "\nX = self, NV# = # NVLinks, PIX = one PCIe switch, PXB = several PCIe switches, PHB = a PCIe \
         host bridge, NODE = host bridges in one NUMA node, SYS = across NUMA nodes (SMP interconnect)\n"
    );
    for d in &topology.devices {
        let pcie = match (d.pcie_gen, d.pcie_width, d.pcie_peak_gb_s) {
            (Some(generation), Some(width), Some(peak)) => format!(
                "PCIe gen{generation} x{width} (max gen{} x{}): {peak:.1} GB/s per direction",
                d.pcie_max_gen.map_or("?".into(), |g| g.to_string()),
                d.pcie_max_width.map_or("?".into(), |w| w.to_string())
            ),
            _ => "PCIe link unknown".into(),
        };
        let nvlink = if d.nvlinks.is_empty() {
            "no NVLink".to_string()
        } else {
            format!("{} NVLinks: {:.0} GB/s per direction", d.nvlinks.len(), d.nvlink_peak_gb_s)
        };
        let _ = writeln!(
            out,
            "GPU{} {} ({}, {} GiB, bus {}): {pcie}; {nvlink}",
            d.index,
            d.name,
            d.uuid,
            d.memory_total >> 30,
            d.bus_id
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_peaks() {
        assert_eq!(pcie_lane_gb_s(4).map(|l| (l * 16.0 * 10.0).round() / 10.0), Some(31.5));
        assert_eq!(pcie_lane_gb_s(9), None);
        assert_eq!(nvlink_gb_s(4) * 18.0, 450.0);
    }
}
