//! SARIF 2.1.0, as the compiled walk's report writes it ([`crate::compiled_report`]).

/// The SARIF 2.1.0 schema URI written into `$schema`.
pub const SARIF_SCHEMA: &str = "https://json.schemastore.org/sarif-2.1.0.json";
