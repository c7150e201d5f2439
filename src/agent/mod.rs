//! The executor agent (`scopegate executor`): dials out to the gateway, keeps the tunnel up,
//! and runs what its tenant declared on this machine, inside its own root and never beyond it.
