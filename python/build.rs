//! PyO3's cfgs for this crate's own code: `Py_GIL_DISABLED` when the module is built for a
//! free-threaded interpreter (`pair.rs`'s counters add atomically only there).

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
