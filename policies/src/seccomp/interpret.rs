//! A tiny interpreter for the classic-BPF subset seccomp programs use, so tests can ask
//! "what happens to this syscall" of the exact program a worker installs.

use airlock_protocol::BpfInstruction;

/// What the kernel does with a syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The syscall runs.
    Allow,
    /// It fails with this errno.
    Errno(u32),
    /// The supervisor is notified (the reporting form); the value's data bits.
    Notify(u32),
    /// The process is killed with SIGSYS.
    KillProcess,
    /// Any other return value.
    Other(u32),
    /// The program is malformed (out-of-bounds jump or unknown opcode).
    Invalid,
}

/// Runs `program` on a syscall (`nr`, `arch`, `args`).
pub fn evaluate(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> Verdict {
    run(program, arch, nr, args).0
}

/// How many instructions the program executes for a syscall (what each syscall costs).
pub fn steps(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> usize {
    run(program, arch, nr, args).1
}

fn run(program: &[BpfInstruction], arch: u32, nr: u32, args: [u64; 6]) -> (Verdict, usize) {
    let mut steps = 0;
    let verdict = run_counting(program, arch, nr, args, &mut steps);
    (verdict, steps)
}

fn run_counting(
    program: &[BpfInstruction],
    arch: u32,
    nr: u32,
    args: [u64; 6],
    steps: &mut usize,
) -> Verdict {
    let load = |offset: u32| -> Option<u32> {
        match offset {
            0 => Some(nr),
            4 => Some(arch),
            16..=63 => {
                let index = ((offset - 16) / 8) as usize;
                let high = (offset - 16) % 8 == 4;
                let value = args[index];
                Some(if high {
                    (value >> 32) as u32
                } else {
                    value as u32
                })
            }
            _ => None,
        }
    };
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    while let Some(i) = program.get(pc) {
        pc += 1;
        *steps += 1;
        match i.code {
            0x20 => match load(i.k) {
                Some(v) => acc = v,
                None => return Verdict::Invalid,
            },
            0x54 => acc &= i.k,
            0x05 => pc += i.k as usize,
            0x15 | 0x25 | 0x35 | 0x45 => {
                let taken = match i.code {
                    0x15 => acc == i.k,
                    0x25 => acc > i.k,
                    0x35 => acc >= i.k,
                    _ => acc & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            0x06 => {
                return match i.k {
                    0x7fff_0000 => Verdict::Allow,
                    0x8000_0000 => Verdict::KillProcess,
                    k if k & 0xffff_0000 == 0x0005_0000 => Verdict::Errno(k & 0xffff),
                    k if k & 0xffff_0000 == 0x7fc0_0000 => Verdict::Notify(k & 0xffff),
                    k => Verdict::Other(k),
                };
            }
            _ => return Verdict::Invalid,
        }
    }
    Verdict::Invalid
}
