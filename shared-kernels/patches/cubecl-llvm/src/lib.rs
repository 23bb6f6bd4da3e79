//! Stand-in for `cubecl-llvm` 0.11.3. The real crate's build script downloads a prebuilt LLVM,
//! which cannot be fetched here. lockstep selects cubecl-cuda's NVRTC (`cpp`) backend, so the
//! LLVM backend is never constructed at run time; its compile entry point returns an error.
//! `ptx_version` and `lowered_features` are copied verbatim from the real crate because
//! cubecl-cuda calls them on every device (they do not touch LLVM).

pub mod nvptx {
    pub mod ptx_version;
}
pub mod shared {
    pub mod lowered_features;
}

use cubecl_core::ir::nvidia::SmArch;
use cubecl_core::prelude::KernelDefinition;
use cubecl_runtime::compiler::{CompilationError, Compiler};
use cubecl_runtime::kernel::BufferIOAttr;
use nvptx::ptx_version::PtxVersion;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Cpu,
    Nvptx,
}

#[derive(Clone, Debug, Default)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    pub arch: Option<()>,
    pub sm_arch: Option<SmArch>,
    pub ptx_version: Option<PtxVersion>,
    pub grid_constants: bool,
}

#[derive(Clone, Debug)]
pub struct NvptxModule {
    pub ptx: Vec<core::ffi::c_char>,
    pub entrypoint: String,
    pub ir: String,
    pub shared_memory_size: usize,
    pub io: Vec<BufferIOAttr>,
}

#[derive(Debug)]
pub enum PlironArtifact {
    NvptxCode(NvptxModule),
}

impl core::fmt::Display for PlironArtifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlironArtifact::NvptxCode(module) => f.write_str(&module.ir),
        }
    }
}

impl Compiler for PlironCompiler {
    type Representation = PlironArtifact;
    type CompilationOptions = PlironOptions;

    fn buffer_io(repr: &Self::Representation) -> Option<Vec<BufferIOAttr>> {
        match repr {
            PlironArtifact::NvptxCode(module) => Some(module.io.clone()),
        }
    }

    fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &Self::CompilationOptions,
    ) -> Result<Self::Representation, CompilationError> {
        Err(CompilationError::Generic {
            reason: "lockstep is built without cubecl's LLVM backend; enable cubecl-cuda's `cpp` feature (NVRTC)".into(),
            backtrace: cubecl_environment::backtrace::BackTrace::capture(),
        })
    }

    fn extension(&self) -> &'static str {
        "ll"
    }

    fn lang_tag(&self) -> &'static str {
        "llvm"
    }
}
