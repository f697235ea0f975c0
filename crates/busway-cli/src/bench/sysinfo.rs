//! What a benchmark worker reports about itself: CPU time and peak memory, from /proc.

/// Kernel clock ticks per second in /proc/*/stat (USER_HZ, fixed at 100 in the Linux ABI).
const USER_HZ: f64 = 100.0;

/// User plus system CPU seconds used by this process so far (all threads).
pub(crate) fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / USER_HZ
}

/// Peak resident memory of this process in KiB (VmHWM).
pub(crate) fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// What a benchmark baseline is kept per: the CPU model and the core count (ratios to raw
/// move with both; the kernel's version does not name a different machine). A hypervisor may
/// show one model name for several generations ("AMD EPYC"): family, model and stepping
/// tell them apart.
pub(crate) fn machine_key() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_owned())
            })
            .unwrap_or_else(|| "?".into())
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{} (family {}, model {}, stepping {}), {cores} cores",
        cpu_model(),
        field("cpu family"),
        field("model"),
        field("stepping")
    )
}

/// One line describing the machine, for the report.
pub(crate) fn machine() -> String {
    let cpu = cpu_model();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_its_own_process() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(super::cpu_seconds() >= 0.0);
        assert!(super::peak_rss_kib() > 0);
        assert!(super::machine().contains("cores"));
    }
}
