//! Where the host waits for the GPU (`--target cuda`): the residency analysis on its own,
//! for the cases the examples do not reach (no example's loop reads a buffer that the GPU
//! writes later in the same body; if one did, only a GPU would show the race).

use ppc::lower::buf::{Buf, BufId};
use ppc::lower::residency::{BeforeRead, Residency};
use ppc_dialect::{DType, Type};

fn buf(id: u32) -> Buf {
    Buf {
        name: format!("%b{id}"),
        ty: Type::of(DType::F32, &[4]),
        layout: None,
        base: BufId(id),
    }
}

#[test]
fn a_read_meets_later_gpu_writes_through_the_loop_back_edge() {
    let (x, y) = (buf(0), buf(1));
    let mut r = Residency::default();
    r.host_writes(&x);
    r.host_writes(&y);
    // Outside loops, program order is the whole story.
    assert_eq!(r.host_reads(&x), BeforeRead::Nothing);
    r.enter_loop();
    let BeforeRead::WaitIfRewritten(read_x) = r.host_reads(&x) else {
        panic!("a read in a loop defers its wait")
    };
    let BeforeRead::WaitIfRewritten(read_y) = r.host_reads(&y) else {
        panic!("a read in a loop defers its wait")
    };
    r.enter_loop();
    r.device_uses(&[&y], &[&x]);
    r.exit_loop();
    // The GPU wrote x after the read, in an inner loop: the next iteration's read races.
    assert!(r.needs(read_x));
    // It only read y.
    assert!(!r.needs(read_y));
    // After the write, program order says wait.
    assert_eq!(r.host_reads(&x), BeforeRead::Wait);
    r.exit_loop();
}

#[test]
fn a_gpu_write_before_the_read_is_program_order() {
    let x = buf(0);
    let mut r = Residency::default();
    r.enter_loop();
    r.device_uses(&[], &[&x]);
    assert_eq!(r.host_reads(&x), BeforeRead::Wait);
    r.host_writes(&x);
    let BeforeRead::WaitIfRewritten(id) = r.host_reads(&x) else {
        panic!("deferred")
    };
    r.exit_loop();
    // The GPU's write comes before the host's in every iteration: nothing to wait for.
    assert!(!r.needs(id));
}
