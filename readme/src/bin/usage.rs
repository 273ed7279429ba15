//! The README's Usage block, as its build script extracted it (see the
//! crate docs: only the listen address differs).

include!(concat!(env!("OUT_DIR"), "/usage.rs"));
