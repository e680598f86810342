//! Adapter discovery and the device handle: instance creation, adapter
//! choice, device request, validation errors turned into values, and
//! blocking read-back.

use std::sync::{Arc, Mutex};

use super::WgpuError;

/// What `edge-miner doctor` prints about one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H200`...).
    pub name: String,
    /// Graphics API (`Vulkan`, `Metal`, `Dx12`).
    pub backend: String,
    /// Kind of device (`DiscreteGpu`, `IntegratedGpu`, `Cpu`...).
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Largest storage-buffer binding in bytes (bounds the LM head and caches).
    pub max_storage_binding: u64,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} [{} {}] driver {:?}, max storage binding {} MiB",
            self.name,
            self.backend,
            self.device_type,
            self.driver,
            self.max_storage_binding >> 20
        )
    }
}

fn summary(a: &wgpu::Adapter) -> AdapterSummary {
    let info = a.get_info();
    let driver = match (info.driver.is_empty(), info.driver_info.is_empty()) {
        (false, false) => format!("{} {}", info.driver, info.driver_info),
        (false, true) => info.driver.clone(),
        _ => info.driver_info.clone(),
    };
    AdapterSummary {
        name: info.name,
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver,
        max_storage_binding: a.limits().max_storage_buffer_binding_size,
    }
}

/// The native backends we compute on; `WGPU_BACKEND` (wgpu's own variable,
/// e.g. `vulkan`) narrows them.
fn instance() -> wgpu::Instance {
    let backends =
        wgpu::Backends::from_env().unwrap_or(wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12);
    wgpu::Instance::new(wgpu::InstanceDescriptor { backends, ..wgpu::InstanceDescriptor::new_without_display_handle() })
}

fn all_adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
}

/// Every compute adapter wgpu sees on this machine.
pub fn list_adapters() -> Vec<AdapterSummary> {
    all_adapters(&instance()).iter().map(summary).collect()
}

/// Preference when no adapter is named: real GPUs first, software last.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// An open device with its queue. Validation errors are collected (not
/// panicked on) and returned by [`Gpu::take_error`].
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) adapter: AdapterSummary,
    pub(crate) limits: wgpu::Limits,
    errors: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    /// Opens the adapter whose name contains `name` (case-insensitive), or
    /// the most capable one.
    pub(crate) fn open(name: Option<&str>) -> Result<Self, WgpuError> {
        let inst = instance();
        let mut adapters = all_adapters(&inst);
        let adapter = match name {
            Some(n) => {
                let n = n.to_lowercase();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&n))
                    .ok_or_else(|| WgpuError::NoAdapter(format!("no adapter named like {n:?}")))?
            }
            None => {
                adapters.sort_by_key(|a| rank(a.get_info().device_type));
                adapters.into_iter().next().ok_or_else(|| WgpuError::NoAdapter("wgpu sees no adapter".into()))?
            }
        };
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tributary-miner"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| WgpuError::Device(e.to_string()))?;
        let errors: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert_with(|| e.to_string());
            }
        }));
        Ok(Self { device, queue, adapter: summary(&adapter), limits, errors })
    }

    /// The first validation or out-of-memory error since the last call.
    pub(crate) fn take_error(&self) -> Result<(), WgpuError> {
        match self.errors.lock().ok().and_then(|mut e| e.take()) {
            Some(e) => Err(WgpuError::Device(e)),
            None => Ok(()),
        }
    }

    /// Waits for all submitted work.
    pub(crate) fn wait(&self) -> Result<(), WgpuError> {
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| WgpuError::Device(e.to_string()))?;
        self.take_error()
    }

    /// Maps the first `len` bytes of each (MAP_READ) buffer, waits, and
    /// copies them out as f32.
    pub(crate) fn read_f32(&self, bufs: &[(&wgpu::Buffer, u64)]) -> Result<Vec<Vec<f32>>, WgpuError> {
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, &(b, len)) in bufs.iter().enumerate() {
            if len == 0 {
                continue;
            }
            let tx = tx.clone();
            b.slice(..len).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send((i, r.map_err(|e| e.to_string())));
            });
        }
        drop(tx);
        self.wait()?;
        for (_, r) in rx.try_iter() {
            r.map_err(WgpuError::Device)?;
        }
        let mut out = Vec::with_capacity(bufs.len());
        for &(b, len) in bufs {
            if len == 0 {
                out.push(Vec::new());
                continue;
            }
            let v = {
                let view = b.slice(..len).get_mapped_range().map_err(|e| WgpuError::Device(e.to_string()))?;
                bytemuck::pod_collect_to_vec::<u8, f32>(&view)
            };
            b.unmap();
            out.push(v);
        }
        Ok(out)
    }
}
