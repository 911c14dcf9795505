//! Which of a launcher's GPUs each running task has. The shell claims the
//! devices for the launcher's lifetime; the core hands them to tasks, so
//! that a task starts only once its own devices are free.

/// The held devices no running task has.
#[derive(Debug, Default)]
pub struct Pool {
    /// Highest first: tasks take from the end, lowest first.
    free: Vec<String>,
}

impl Pool {
    pub fn new(devices: &[String]) -> Self {
        let mut free = devices.to_vec();
        free.sort_by(|a, b| b.cmp(a));
        Self { free }
    }

    /// `count` devices for a task about to run, lowest first; `None` if
    /// fewer are free.
    pub fn take(&mut self, count: u32) -> Option<Vec<String>> {
        let at = self.free.len().checked_sub(count as usize)?;
        let mut taken = self.free.split_off(at);
        taken.reverse();
        Some(taken)
    }

    /// A task's devices, free again once its process has ended.
    pub fn give_back(&mut self, devices: Vec<String>) {
        self.free.extend(devices);
        self.free.sort_by(|a, b| b.cmp(a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_task_gets_devices_no_other_running_task_has() {
        let held: Vec<String> = ["0", "1", "2", "3"].map(String::from).into();
        let mut pool = Pool::new(&held);
        let first = pool.take(2).unwrap();
        let second = pool.take(1).unwrap();
        assert_eq!(first, ["0", "1"]);
        assert_eq!(second, ["2"]);
        assert_eq!(pool.take(2), None, "one left");
        pool.give_back(first);
        assert_eq!(pool.take(3).unwrap(), ["0", "1", "3"]);
        assert_eq!(pool.take(0).unwrap(), Vec::<String>::new());
    }
}
