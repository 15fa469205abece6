//! Element types of the tensors a request carries, as sglang names them.

use core::fmt;

/// A tensor element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Dtype {
    Float16,
    Float32,
    Float64,
    BFloat16,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Bool,
    Float8E4M3Fn,
    Float8E5M2,
    Complex64,
    Complex128,
}

/// A dtype name ferry does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownDtype;

impl fmt::Display for UnknownDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown dtype")
    }
}

impl core::error::Error for UnknownDtype {}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 17] = [
        Self::Float16,
        Self::Float32,
        Self::Float64,
        Self::BFloat16,
        Self::Int8,
        Self::Int16,
        Self::Int32,
        Self::Int64,
        Self::UInt8,
        Self::UInt16,
        Self::UInt32,
        Self::UInt64,
        Self::Bool,
        Self::Float8E4M3Fn,
        Self::Float8E5M2,
        Self::Complex64,
        Self::Complex128,
    ];

    /// The name on the wire, as PyTorch spells it without `torch.`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Float16 => "float16",
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::BFloat16 => "bfloat16",
            Self::Int8 => "int8",
            Self::Int16 => "int16",
            Self::Int32 => "int32",
            Self::Int64 => "int64",
            Self::UInt8 => "uint8",
            Self::UInt16 => "uint16",
            Self::UInt32 => "uint32",
            Self::UInt64 => "uint64",
            Self::Bool => "bool",
            Self::Float8E4M3Fn => "float8_e4m3fn",
            Self::Float8E5M2 => "float8_e5m2",
            Self::Complex64 => "complex64",
            Self::Complex128 => "complex128",
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            Self::Int8 | Self::UInt8 | Self::Bool | Self::Float8E4M3Fn | Self::Float8E5M2 => 1,
            Self::Float16 | Self::BFloat16 | Self::Int16 | Self::UInt16 => 2,
            Self::Float32 | Self::Int32 | Self::UInt32 => 4,
            Self::Float64 | Self::Int64 | Self::UInt64 | Self::Complex64 => 8,
            Self::Complex128 => 16,
        }
    }

    /// The dtype named `name`; PyTorch's `str(dtype)` form (`torch.bfloat16`)
    /// and its aliases (`half`, `float`, `double`, `long`, ...) are accepted.
    pub fn from_name(name: &str) -> Result<Self, UnknownDtype> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        Ok(match name {
            "float16" | "half" => Self::Float16,
            "float32" | "float" => Self::Float32,
            "float64" | "double" => Self::Float64,
            "bfloat16" => Self::BFloat16,
            "int8" => Self::Int8,
            "int16" | "short" => Self::Int16,
            "int32" | "int" => Self::Int32,
            "int64" | "long" => Self::Int64,
            "uint8" => Self::UInt8,
            "uint16" => Self::UInt16,
            "uint32" => Self::UInt32,
            "uint64" => Self::UInt64,
            "bool" => Self::Bool,
            "float8_e4m3fn" => Self::Float8E4M3Fn,
            "float8_e5m2" => Self::Float8E5M2,
            "complex64" | "cfloat" => Self::Complex64,
            "complex128" | "cdouble" => Self::Complex128,
            _ => return Err(UnknownDtype),
        })
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
