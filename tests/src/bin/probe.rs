//! The escape battery's hostile program, built by the tests: each run attempts one attack
//! from `airlock_battery` and prints what happened (see `airlock_battery::probe`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(airlock_battery::probe::main(&args));
}
