//! OpenBLAS's single-precision GEMM through its C interface: the maintained GEMM, with kernels
//! chosen at run time for the CPU it runs on (Debian builds it with `DYNAMIC_ARCH`), so one
//! executable is fast on AVX2 and AVX-512 nodes alike.
//!
//! Each call runs on one thread: the runtime calls it once per block from the pool's threads
//! (`pool.rs`), and a BLAS's own threads beside those would fight them for the cores, so it is
//! told to use one. Several pool threads call it at once, which Debian's threaded build
//! (`libopenblas0-pthread`, what setup installs) allows; its serial build shares one scratch
//! buffer between callers (two threads gave wrong products on its Haswell kernels), so with that
//! build, should the system's alternatives select it, the calls take turns.

use std::sync::{Mutex, OnceLock};

#[link(name = "openblas")]
extern "C" {
    fn cblas_sgemm(
        order: i32,
        trans_a: i32,
        trans_b: i32,
        m: i32,
        n: i32,
        k: i32,
        alpha: f32,
        a: *const f32,
        lda: i32,
        b: *const f32,
        ldb: i32,
        beta: f32,
        c: *mut f32,
        ldc: i32,
    );
    fn openblas_set_num_threads(n: i32);
    /// 0: the serial build, 1: threads, 2: OpenMP.
    fn openblas_get_parallel() -> i32;
    fn openblas_get_corename() -> *const std::ffi::c_char;
}

/// The kernels OpenBLAS chose for this CPU (`Haswell`, `Cooperlake`, ...): its own detection,
/// or `OPENBLAS_CORETYPE` from the environment, which overrides it.
pub fn kernels() -> String {
    // SAFETY: OpenBLAS returns a static NUL-terminated name.
    unsafe { std::ffi::CStr::from_ptr(openblas_get_corename()) }
        .to_string_lossy()
        .into_owned()
}

/// Set up once: one thread per call; `Some` lock when calls must take turns (serial build).
fn setup() -> Option<&'static Mutex<()>> {
    static TURNS: OnceLock<Option<Mutex<()>>> = OnceLock::new();
    TURNS
        .get_or_init(|| {
            // SAFETY: OpenBLAS's settings; no pointers involved.
            unsafe {
                openblas_set_num_threads(1);
                (openblas_get_parallel() == 0).then(|| Mutex::new(()))
            }
        })
        .as_ref()
}

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

/// One matrix operand: its first element and its strides (elements) between rows and columns.
#[derive(Clone, Copy)]
pub struct Operand {
    pub ptr: *const f32,
    pub row_stride: isize,
    pub col_stride: isize,
}

impl Operand {
    /// CBLAS's transpose flag and leading dimension, if one of the strides is 1.
    fn layout(&self) -> Option<(i32, i32)> {
        let lead = |s: isize| i32::try_from(s.max(1)).ok();
        if self.col_stride == 1 {
            Some((NO_TRANS, lead(self.row_stride)?))
        } else if self.row_stride == 1 {
            Some((TRANS, lead(self.col_stride)?))
        } else {
            None
        }
    }
}

/// `c[m×n] = a[m×k] · b[k×n]`, or `c += a · b` with `accumulate` (`c`'s pointer is written
/// through).
///
/// # Safety
/// The operands cover their `m×k`, `k×n` and `m×n` elements at their strides, and `c`
/// overlaps neither input.
pub unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    c: Operand,
    accumulate: bool,
) {
    let beta = if accumulate { 1.0 } else { 0.0 };
    let _turn = setup().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
    let dims = (i32::try_from(m), i32::try_from(n), i32::try_from(k));
    let c_row_major = (c.col_stride == 1)
        .then(|| i32::try_from(c.row_stride).ok())
        .flatten();
    match (a.layout(), b.layout(), c_row_major, dims) {
        (Some((ta, lda)), Some((tb, ldb)), Some(ldc), (Ok(m), Ok(n), Ok(k))) => {
            let c = c.ptr.cast_mut();
            // SAFETY: the caller's contract, in CBLAS's terms.
            unsafe {
                cblas_sgemm(
                    ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ptr, lda, b.ptr, ldb, beta, c, ldc,
                )
            }
        }
        // Operands with no unit stride (ppc's lowering makes none: it copies strided views):
        // plain loops, in k order.
        _ => {
            for i in 0..m {
                for j in 0..n {
                    let mut sum = 0.0f32;
                    for p in 0..k {
                        // SAFETY: inside the operands, by the caller's contract.
                        unsafe {
                            let x = *a
                                .ptr
                                .offset(i as isize * a.row_stride + p as isize * a.col_stride);
                            let y = *b
                                .ptr
                                .offset(p as isize * b.row_stride + j as isize * b.col_stride);
                            sum += x * y;
                        }
                    }
                    let at = i as isize * c.row_stride + j as isize * c.col_stride;
                    // SAFETY: inside `c`, by the caller's contract.
                    unsafe {
                        let cp = c.ptr.cast_mut().offset(at);
                        *cp = if accumulate { *cp + sum } else { sum };
                    }
                }
            }
        }
    }
}
