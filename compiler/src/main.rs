//! The `ppc` command: see `ppc --help`.
#![forbid(unsafe_code)]

fn main() {
    let code = ppc::cli::run(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    std::process::exit(code);
}
