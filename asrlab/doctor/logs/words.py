"""The patterns the event readers (:mod:`.events`) match a line with, in one home, so that a reader is written
against a meaning (a collective that gave up waiting, a loss that is not finite), not one toolkit's words."""

from __future__ import annotations

import re

# (a line hard-wrapped by a terminal or a paste, "... OpTy" / "pe=BROADCAST ...": the collective's number alone)
WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout(?:: Work\w*\((?:SeqNum=(\d+),?\s*)?(?:OpType=(\w+))?"
    r"(?:.*?Timeout\(ms\)=(\d+))?)?"
)
NCCL_TIMEOUT = re.compile(r"Timeout at NCCL work: (\d+)")
# the NCCL watchdog ended its process on its own device's error ("CUDA error: ..."), not on a collective's timeout
WATCHDOG_EXC = re.compile(r"watchdog thread terminated with exception: (.+)")
# NCCL's word on a hang with no collective's timeout quoted: its heartbeat monitor's, or its watchdog's ending
NCCL_HANG = re.compile(r"watchdog got stuck for (\d+) seconds?|Some NCCL operations have failed or timed out")
# a tqdm bar's end, its rate and postfix: "7.66it/s, loss=2.606]"
BAR_END = r"(?:it/s|s/it)(?:,[^\]]*)?\]"
# the names a loop of its own gives its loss, besides any "...loss..."
OWN_LOSSES = r"ctc|xent|cross_?entropy|smooth_?l1|nll|mse|rnnt|objf|objective|(?-i:obj)|kl"
# the shell's word for a SIGKILLed child, in its locale, glued to a bar's end or a value, or over a redrawn line
BASH_KILLED = re.compile(
    rf"(?:^\W{{0,3}}|line \d+:\s+\d+ |{BAR_END}|(?<=\d)(?=Killed\s*$))"
    r"(?:Killed(?:\b(?!\s+process)|(?=[a-z]))|已杀死|已殺死|Getötet|強制終了|Processus arrêté|Terminado \(killed\))"  # zh, de, ja, fr, es
    r"|sigkill_handler\] Killing subprocess \d"  # DeepSpeed's launcher SIGKILLing its ranks (its line on why: cut)
)
# a shell's, srun's or libc's word for a child a signal ended, also after a bar, or by pid ("156 Segmentation fault")
SHELL_SIGNAL = re.compile(
    r"(?:^|^\d+ |line \d+:\s+\d+ |: task \d+: |srun: error: .*?: |\S\s{3,}|\])"
    r"(Aborted(?!!)|Segmentation fault|Bus error|Illegal instruction|Floating point exception)\b|"
    r"(?:^|zsh: )(segmentation fault|bus error)\b|^zsh: (abort|illegal hardware instruction|floating point exception)\b|"
    r"^\[\d+\]\s+(?:[+-]\s+)?\d+ (segmentation fault|bus error|abort|killed|floating point exception)\b|"  # zsh's job
    # UCX's, Open MPI's handler; Python's faulthandler; Paddle's "FatalError: `Segmentation fault` is detected by the OS"
    r"(?:\] Caught signal \d+ \(|\] Signal: |Fatal Python error: |FatalError: `)"
    r"(Segmentation fault|Bus error|Illegal instruction|Floating point exception|Aborted)\b|"
    r"\*\*\* (SIG(?:SEGV|BUS|ILL|FPE|ABRT)) (?:\(@0x[0-9a-f]+\) received by PID|received at time=\d)"  # glog's, abseil's
)
_SIGS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
_BASH_SAYS = ("Aborted", "Segmentation fault", "Bus error", "Illegal instruction", "Floating point exception")
_ZSH_SAYS = ("abort", "segmentation fault", "bus error", "illegal hardware instruction", "floating point exception")
# the signal each word names: bash's, zsh's (its "killed" too), glog's
SHELL_SIGNALS = {**dict(zip(_BASH_SAYS + _ZSH_SAYS, _SIGS * 2)), "killed": "SIGKILL", **{s: s for s in _SIGS}}
# the shell's word for a child SIGTERM ended (bash's "Terminated"), a terminal's echo of Ctrl-C
# (bash's job report pads the status before the command: "line 114: 1508441 Hangup       "${CMD[@]}" 2>&1")
SHELL_STOP = re.compile(r"(?:^-?|line \d+:\s+\d+ |\]|\|)\s*(Terminated|Hangup|\^C)(?:\s*$|\s{2,}\S)")  # "-^C": a cell's
# a scheduler that ended the job: Slurm's time limit or cancel; srun's word on a task (its global rank) that ended
SRUN_TASK = re.compile(r"srun: error: \S+: task (\d+): ")
SCHEDULER_STOP = re.compile(
    r"\*\*\* (?:JOB|STEP) [\d.]+ ON \S+ CANCELLED AT \S+(?: DUE TO (TIME LIMIT|PREEMPTION))?|"
    # IBM LSF's job report: its owner's or admin's kill, a run, CPU or wall-clock limit, a preemption
    r"^TERM_(?:(?:FORCE_|REQUEUE_)?(?:OWNER|ADMIN)|(RUNLIMIT|CPULIMIT|DEADLINE|WINDOW)|(PREEMPT)): job "
)
# a child a signal ended, in a launcher's or Python's words: "process 1 exited with signal 11", "Command '[...]' died
# with <Signals.SIGKILL: 9>." (subprocess.CalledProcessError, as Accelerate's launcher raises it)
SIGNAL_EXIT = re.compile(
    r"(?:\b(?:rank|worker|process|task) (\d+) )?\b(?:exited|died) (?:with|by) (?:signal (SIG[A-Z]+|\d+)\b|<Signals\.(SIG[A-Z]+): \d+>)"
)
# a process's word on its exit status: "exited with status 1", Paddle's "Container rank 6 status failed ... code -6"
STATUS = re.compile(
    r"(?:exited|finished|terminated|exit(?:ed)?)(?: with)? (?:exit )?(?:status(?: code)?|code)\s*:?\s*(-?\d+)"
    r"|returned non-zero exit (?:status|code)\s*:?\s*(-?\d+)|job failed, log is in"
    r"|[Rr]ank (\d+) status failed\b.*?\bcode (-?\d+)"
    r"|^# Ended \(code (-?\d+)\)"  # Kaldi's and ESPnet's run.pl, at the head of a job's log
    r"|(?:'--local_rank=(\d+)'.*?)?exits with return code\s*=\s*(-?\d+)"  # DeepSpeed's launcher on a child
    r"|\berror code (-\d+)\b"  # a child's negative code (DIGITS on Caffe's): the signal that ended it
    r"|\b(?:rank|worker|[Pp]rocess|[Tt]ask) (\d+) (?:exit(?:ed)?|died|terminated) with (?:exit ?code |code |status (?:code )?)?"
    r"(-?\d+)\b"  # a launcher's own (Horovod's "Process 1 exit with status code 1.")
    r"|job failed with status (\d+), log is in"  # Kaldi's queue.pl: a shell's status, 128+N for signal N
    # a launcher of one's own on its child, Popen's word: "worker r1 (pid 32050) died, returncode=-9"
    r"|\b(?:rank|worker) r?(\d+)\b.{0,40}?\breturn ?code\s*[=:]?\s*(-?\d+)\b|\breturn ?code\s*[=:]\s*(-\d+)\b"
    r"|W&B process to finish\.\.\. \(failed (\d+)\)"  # wandb's word on the script it ran beside: its exit code
)
DIED = re.compile(r"died with <Signals\.SIG\w+: (\d+)>")  # subprocess's CalledProcessError on a child a signal ended
# Horovod's stall inspector: a tensor some ranks never submitted, the ranks it waits for (older: those ready)
HOROVOD_STALL = re.compile(r"submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for")
HOROVOD_MISSING = re.compile(r"([\w./-]+) \[(missing|ready) ranks: (\d+(?:, ?\d+)*)\]")  # an op's name, its ranks
# asrlab watch's last line on a failed job, from its run folder: the failure where the console names none
WATCH_VERDICT = re.compile(r"^asrlab watch: (crashed|killed|stopped|nonfinite|out_of_memory): (.*?)\s*$")
# asrlab watch's lines in the job's console: the stall it found, a signal to it; a rank's own watchdog's stall
WATCH_SAID = re.compile(
    r"asrlab watch: (?:no rank has moved for [\d.]+ s: (.*?)(?: \(report: [^)]*\))?\s*$|stalled: (.*?)\s*$|"
    r"(SIG[A-Z]+): ending the job)|(?:^|asrlab\.lab\.stall\.watchdog: )STALL: (.*?)(?: \(report: [^)]*\))?\s*$|"
    r"(the ranks moved on after the stall it reported)"  # then the job finished: the stall it reported passed
)
# mpirun's: a rank a signal ended; that some process failed; a background loop's uncaught exception (a peer gone)
MPIRUN = re.compile(
    r"process rank (\d+) with PID \S+ on node \S+ exited on signal (\d+)|"
    r"Primary job\s+terminated normally, but \d+ process(?:es)? returned|uncaught exception: (.+)|"
    r"^\s*Process name:\s+\[\[\d+,\d+\],(\d+)\]"  # the first process to exit non-zero, by its rank
    r"|^\s*Process name:\s+(\d+)\s*$"  # Horovod's gloo runner's, by its rank alone
)
# a process that ends itself: glog's FATAL line (a failed CHECK, then its stack), Paddle's launcher on the trainer
FATAL = re.compile(
    r"^F\d{4} [\d:.]+\s+\d+ \S+:\d+\] (.*)|the trainer process with rank=\[(\d+(?:, ?\d+)*)\] was aborted"
)
LUA_ERROR = re.compile(r"\blua(?:jit)?: (.+?\.lua:\d+:.*)")  # Lua's (Torch7's) error, its "stack traceback:" below
HYDRA = re.compile(r"(?:^|E)rror executing job with overrides")
ASRLAB = re.compile(r"^asrlab: error: (?:rank (\d+)(?: \([^)]*\))?: )?(.*)")  # asrlab's own CLI on a failed run
# asrlab.lab's stall watch on a rank's error: "rank 1 failed at step 3 (in the step's computation): RuntimeError: ..."
ASRLAB_RANK = re.compile(r"\brank (\d+) failed at step (\d+) \([^)]*\): ([\w.]+): (.*)")
NCCL_SEQ = re.compile(r"last enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
GLOO = re.compile(r"Timed out waiting (\d+)ms for (send|recv) operation")
JAX_BARRIER = re.compile(r"Barrier timed out\. Barrier_id: (\S+?)\.?(?:\s|$)")  # its coordination service's
STORE_KEY = re.compile(r"Timeout waiting for key: (\S+) after (\d+) ?ms")  # c10d's store: a key no peer wrote
# a rank that could not reach the rendezvous store: a peer (or the store's host) never came
CONNECT = re.compile(r"socket has timed out after (\d+)s while trying to connect")
STORE = re.compile(r"store based barrier.*?rank:? (\d+).*?world_size=(\d+), (?:worker_count|num_workers_joined)=(\d+)")
# lines that say the numbers went non-finite (or past what the toolkit accepts), whatever follows
NONFINITE_LINE = re.compile(
    r"loss \(=[^)]*\) is not correct|Parameter is not finite|NaN or Inf found in input tensor|"
    r"gradients at all steps are invalid|[Gg]rad(?:_| )scale is (?:too )?small|[Ll]oss is not finite|"
    r"[Nn]onfinite loss|non-finite loss|[Ll]oss is (?:nan|inf)\b|nan loss detected|Detected (?:NaN|inf)(?![\w/]*spik)|"
    r"gradients are (?:NaN/inf|nan|inf)|Patience not yet exhausted|Non-finite norm encountered|"
    r"\b(?:nan|inf(?:inite)?|non-?finite)\s+(?:grad(?:ient)?s?(?:_norm| norm)?|loss(?:es)?)\b|"
    r"returned (?:nan|inf) values|\b(?:nan|inf)s? (?:detected|found|encountered)\b|"
    r"\b(?:found|detected|encountered) (?:a )?(?:nan|inf)\b(?![\w/]*spik)|"  # not a detector's "nan/inf/spiky" (a spike too)
    r"Invalid loss, terminating training|"  # Keras's TerminateOnNaN
    r"\bcontains NaN or Inf\b|"  # Ignite's TerminateOnNan: "Output 'nan' contains NaN or Inf. Stop training"
    r"\bMoving average ignored a value of (?:nan|inf)\b|"  # YOLACT's, on a loss gone non-finite
    r"\bmetric=(?:nan|inf) vs\. limit=|"  # icefall's Whitening module: its activations' covariance not finite
    r"\bThe sum of [\w.\[\]]+ is not finite\b|"  # icefall's inf-check hooks on a module's output or gradient
    r"\bloss\b.{0,80}?\btrain(?:ing)?\s*[=:]\s*[-+]?(?:nan|inf)\b|"  # uPIT's "Loss(...) - Epoch 1: train = nan(...)"
    r"\b(?:loss|grad(?:ient)?[_ ]?norm) (?:exploded|diverged|went|became|blew up|was) (?:to )?(?:nan|inf)\b|"  # Tacotron-2's
    # "Loss exploded to nan", MockingBird's "grad_norm was NaN!"
    rf"\b(?:\w*loss\w*|{OWN_LOSSES}|grad(?:ient)?[_ ]?norm) (?:is |was |went |became )?(?:not finite|non-?finite)\b",
    re.I,
)
# a model's own outputs, as preference trainers log them ("logps/chosen", "logits/rejected"): not finite, the model
# is not, whatever the loss says
OUTPUTS = r"logits|logps|log_probs"
OUTPUT = re.compile(rf"(?:{OUTPUTS})/")  # such a value's name, kept whole ("logps/chosen", not "chosen")
# a loss (by a loop's own name too) or a gradient norm printed as a value: "loss=nan", "grad_norm nan", '"ctc": NaN';
# any training value by its logger's name ("train/cyc     : nan": a GAN's loss terms named by what they weigh)
VALUE = re.compile(
    rf"(?<![\w.])([\w/]*loss\w*|grad_?norm|gnorm|(?:[a-z]+_)?(?:{OWN_LOSSES})(?!\w)|(?:{OUTPUTS}|train)/\w+)['\"]?\s*[=:|│┃]?\s*['\"]?"
    r"(?:tensor\()?"
    r"([-+]?(?:nan|inf(?:inity)?|[\d.]+(?:e[-+]?\d+)?))(?:x*\b)",  # PaddleOCR pads a value to 6 with x: "loss: nanxxx"
    re.I,
)
_TOTALS = ("loss", "total_loss", "train_loss", "avg_loss", "loss_avg")  # a value's name that is the total loss
# a loss printed finite beside its running average printed not finite (Coqui's "| > loss: 0.104  (nan)"): a loss
# not finite came in since the last print (a gradient norm's is not: fp16's skipped overflows leave its average inf)
AVERAGE_GONE = re.compile(
    rf"(?<![\w.])([\w/]*loss\w*|(?:[a-z]+_)?(?:{OWN_LOSSES})(?!\w))['\"]?\s*[=:]\s*[-+]?[\d.]+(?:e[-+]?\d+)?\s+\((nan|inf)\)",
    re.I,
)


def nonfinite_said(text: str) -> str | None:
    """What in a line says the numbers went non-finite; None for fp16's "overflow detected (inf grads), skipping"."""
    if ("verflow" in text and OVERFLOW_SKIP.search(text)) or ("skipped so far" in text and GUARD_SKIP.search(text)):
        return None
    m = NONFINITE_LINE.search(text)
    return m.group(0) if m else nonfinite_values(text)


# a loss scale's value printed ("grad_scale=289800.192", '"loss_scale": 1024.0', "loss scale: 65536.0")
SCALE_VALUE = re.compile(r"\b(?:grad|loss)[_ ]scale['\"]?\s*[=:]\s*\d", re.I)


def norm_only(text: str) -> bool:
    """Whether the values a line prints non-finite are gradient norms alone (its losses finite or not printed)."""
    bad = [k.lower() for k, v in VALUE.findall(text) if v.lower().lstrip("+-") in ("nan", "inf", "infinity")]
    return bool(bad) and all("norm" in k for k in bad)


def nonfinite_values(text: str) -> str | None:
    """The field that says a line's numbers went non-finite: the total loss or the gradient norm; a term only where
    no total is printed beside it (ESPnet's CTC-only [valid] prints loss_att=nan, an unused term, by a finite loss)."""
    if "nan" not in text.lower() and "inf" not in text.lower():
        return None
    vals = [(k.lower() if OUTPUT.match(k) else k.split("/")[-1].lower(), v.lower()) for k, v in VALUE.findall(text)]
    bad = [k for k, v in vals if v.lstrip("+-") in ("nan", "inf", "infinity")]
    told = any(k in _TOTALS or "norm" in k or OUTPUT.match(k) for k in bad) or not any(k in _TOTALS for k, _ in vals)
    if bad and told:
        return bad[0]
    m = AVERAGE_GONE.search(text) if "(" in text else None
    return f"{m[1]}'s running average" if m else None


# a line that says an epoch starts, with no step of its own: SpeechBrain's, Keras's, a loop's own
EPOCH_START = re.compile(
    r"(?:Going into|Starting|Start(?:ing)? training|Begin(?:ning)?) epoch:? (\d+)|^\W*Epoch (\d+)/\d+\s*$", re.I
)
# an out of memory a toolkit goes on from by design, the batch skipped (fairseq's)
RECOVERED = re.compile(r"ran out of memory[^,]{0,40}, skipping batch")
# TensorFlow 1.x's supervisor on the error that ended its training loop
TF_COORDINATOR = re.compile(r"Error reported to Coordinator: <class '([\w.]+)'>, (.+)")
# the launcher itself was told to end: torchrun's agent, Accelerate's, a signal to the job's main process
DEATH = re.compile(
    r"Received (?:Signals\.)?(SIG\w+|\d+) death signal|SignalException: Process \d+ got signal: (\d+)|"
    r"^(KeyboardInterrupt)\s*$|Received (SIG(?:TERM|INT|HUP|USR1)): \d+|"  # Lightning's signal connector
    r"^\*\*\* (SIG(?:TERM|INT|HUP)) (?:\(@0x[0-9a-f]+\) received by PID|received at time=\d)|"  # glog's, abseil's
    r"\bReceived signal (\d+), initiating graceful stop|"  # NeMo's preemption callback (a scheduler's notice)
    r"\b(?:[Rr]eceived|[Cc]aught|[Gg]ot) (SIG(?:TERM|INT|HUP|USR1|USR2))\b(?!:? \d)|\b(SIG(?:TERM|INT|HUP)) (?:caught|received)\b|"
    r"\b(?:[Rr]eceived|[Cc]aught|[Gg]ot) signal:? (1|2|15)\b(?!\.\d)"
)


def death_signal(text: str) -> str | None:
    """The signal a line of :data:`DEATH` says (``SIGTERM``), or None."""
    m = DEATH.search(text)
    said = next((g for g in m.groups() if g), None) if m else None
    return None if said is None else "SIGINT" if said == "KeyboardInterrupt" else signame(said)


# a logger's line on Ctrl-C, not an exception line ("Detected KeyboardInterrupt", "CRITICAL Keyboard Interrupt.")
INTERRUPTED = re.compile(
    r"(?:Detected|Caught|Got|Received|CRITICAL|INFO|WARNING)\W+Keyboard ?Interrupt\b"
    r"|forrtl: error \(200\): program aborting due to control-C event"  # Intel's Fortran runtime (MKL on Windows)
    r"|^(?:ERROR: )?InterruptException:",  # Julia's, on Ctrl-C
    re.I,
)
# ssh's (telnet's) last word when the session a job ran in the foreground of ends: the job gets SIGHUP
HANGUP = re.compile(r"Connection (?:to \S+ )?closed(?: by (?:foreign|remote) host)?\.\s*$")
BARE_EXC = re.compile(r"^((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))\s*$")  # "AssertionError": a class, no message
EXC_LINE = re.compile(
    r"^(?:\w+ )?((?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception)): (.+)"
    r"|^(?:ERROR|ASSERTION_FAILED) (\([\w-]+\[[^\]]*\][^)]*\)) (.+)"  # Kaldi's "ERROR (nnet3-train[5.5]:Func():x.cc:12) ..."
)
# an exception's line glued onto a progress bar cut mid-redraw ("...train/latenRuntimeError: Expected to ...")
# (Python's and torch's own names only: glued, a name's first letters cannot be told from the text before it)
BAR_GLUED_EXC = re.compile(
    r"(?<=[a-z\d\]=,])((?:torch\.(?:cuda\.)?)?(?:Runtime|Value|Key|Index|Type|Attribute|Assertion|OutOfMemory|"
    r"FloatingPoint|ZeroDivision|FileNotFound|OS|Import|ModuleNotFound|NotImplemented|Memory|Overflow|Distributed)"
    r"Error): (.+)"
)
# RETURNN's hook on an uncaught exception, before its traceback: "Unhandled exception <class 'RuntimeError'> in thread"
UNHANDLED = re.compile(r"^Unhandled exception <class '([\w.]+)'> in thread")
# the device's error on a logger's line, with no exception line of Python's; Marian's "CUDA error 999 'unknown error'"
CUDA_ERROR = re.compile(
    r"\bCUDA error: (.+)|\b(device-side assert triggered)|\bCUDA error (\d+ '[^']+'.*)|"
    r"\bcuda runtime error \(\d+\) : (.+?)(?: at \S+)?$"  # Lua Torch's cutorch
)
# a process's word that it ended: Marian's ABORT, a TPU runtime's, Ray's and JAX's on a worker or task gone, a kernel's
ENDED_ITSELF = re.compile(
    r"\bError: (Aborted) from \S+ in \S|!!!! (FATAL ERROR) !!!!|\b(A worker died) or was killed while executing a task|"
    r"/task:(\d+) (has been set to ERROR) in coordination service|\b(kernel process died)\b"
)
# what a toolkit says of the item it was reading when the error came (ESPnet's data loader)
ITEM = re.compile(r"Error happened with path=([^,]+), type=\w+, id=(\S+)")
AGENT_FAIL = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# a launcher ending its workers (torchrun's agent; torch.multiprocessing.spawn's, once one of them failed)
AGENT_TERM = re.compile(r"(?:Sending process (\d+) closing signal|Terminating process (\d+) via signal) (SIG\w+)")
SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID (\d+)", re.I)
# torchrun's summary record, also as a rendered page copies it: labels and values on lines of their own ("time",
# then "2023-09-14 01:45:50"), fields glued ("rank2 (local rank: 2)exitcode: -9 (pid: 1)error file: <N/A>")
SUMMARY_LOOSE = re.compile(r"^(?:\d{4}-\d\d-\d\d[ _]\d\d:\d\d:\d\d|[\w.-]+)$")
SUMMARY_GLUED = re.compile(r"(?<!local )(?<!local_)\b(rank|exitcode|error[_ ]file|traceback)(?=\s*:|\d)\s*:?\s*")


def summary_fields(s: str, loose: bool = True) -> dict | None:
    """One line of torchrun's summary record as its fields (a traceback's also as ``tb``); {} for a label or value
    of a copied table alone on its line (``loose``: before the record's rank); None for a line not the record's."""
    if m := re.match(r"^(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s*(.*)$", s):
        pairs = [m.groups()]
    elif loose and SUMMARY_LOOSE.match(s):
        return {}
    elif (starts := list(SUMMARY_GLUED.finditer(s))) and starts[0].start() == 0:
        ends = [n.start() for n in starts[1:]] + [len(s)]
        pairs = [(m.group(1).replace(" ", "_"), s[m.end() : e]) for m, e in zip(starts, ends)]
    else:
        return None
    fields = dict(pairs)
    return {**fields, "tb": [fields["traceback"]]} if "traceback" in fields else fields


TERMINATE = re.compile(r"instance of '([^']+)'")
# a loop's own word for the skip, no scale said: "overflow detected (inf grads), skipping step"
OVERFLOW_SKIP = re.compile(r"[Oo]verflow\b.{0,60}?\b[Ss]kip(?:ping|ped|s)?\b()")
# asrlab.lab's numerics guard on a step it skipped
GUARD_SKIP = re.compile(
    r"^step \d+: loss \S+, grad norm (\S+): not finite \([^)]*\); step skipped \(\d+ skipped so far\)"
)
# older DeepSpeed's "OVERFLOW! Rank 0 Skipping step.", later "[Rank 0] Overflow detected. Skipping step."
_DEEPSPEED_SCALE = (
    r"(?:OVERFLOW! Rank (\d+)|\[Rank (\d+)\] Overflow detected\.) Skipping step\. Attempted loss scale: ([\d.e+]+), "
    r"reducing to ([\d.e+]+)"
)
# fairseq's "overflow detected, setting loss scale to: 0.5", any trainer's "reducing loss scale to 1024"
_ANY_SCALE = (
    r"(?:overflow|[Rr]educing|[Dd]ecreas\w*|[Ss]etting)\b.{0,40}?loss[ _]scale "
    r"(?:from [\d.e+-]+ )?(?:to|=):?\s*([\d.e+-]+)"
)
SCALE = (
    (re.compile(_DEEPSPEED_SCALE), "deepspeed"),
    (re.compile(r"Gradient overflow\.\s+Skipping step, loss scaler \d+ reducing loss scale to ([\d.e+]+)"), "apex"),
    (re.compile(r"[Gg]rad(?:_| )scale is (?:too )?small[^\d]*([\d.e+-]+)?"), "icefall"),
    (re.compile(r"The grad norm is (nan|inf)\. Skipping updating the model"), "espnet"),
    (re.compile(_ANY_SCALE), "any"),
    (OVERFLOW_SKIP, "any"),
    (GUARD_SKIP, "asrlab"),
)
# a checkpoint a run resumed from, in toolkits' words or a loop's own ("[ckpt] restored X.pt", "picked up snap.bin")
RESUME = re.compile(
    r"(?:Checkpoint: loading from checkpoint|loading checkpoint from|Loading checkpoint:?|The training was resumed using|"
    r"Restoring states from the checkpoint path at|Restored all states from the checkpoint(?: file)? at|"
    r"Resuming from|resume from|Loading a checkpoint from|Would load checkpoint from|Restored (?:model|checkpoint) from|"
    r"\b(?:restored|picked up|loaded|resumed)(?: from)?(?= \S+\.(?:pt|pth|ckpt|tar|bin|safetensors|h5|pkl)\b))"
    r"\s*:?\s*(\S+?)?[:,;]?(?=\s|$)",  # the path, not the colon the line goes on after
    re.I,
)

# a rendezvous that never started: the store's socket could not listen, bind or be reached
# a socket this process could not open to listen on (its port in use): its own failure, never a peer's consequence
SOCKET_IN_USE = r"server socket has failed to listen on any local network address|[Aa]ddress already in use|EADDRINUSE"
RENDEZVOUS = re.compile(
    rf"{SOCKET_IN_USE}|Rendezvous\w*(?:Timeout|Connection|Closed)Error|failed to (?:bind|connect) to the rendezvous|"
    r"The client socket has timed out after \d+s? while trying to connect"
)
# a line that looks wrong that no rule names (an error record, a word of failure): where no failure is found, the
# verdict is ``unknown`` (quoted), not an all-clear
SUSPECT = re.compile(
    r"(?:^|[\s\[|(:])(?:E\d{4} \d\d:|ERROR\b|CRITICAL\b|FATAL\b|Fatal\b|[Ee]rror\b|[Ee]xception\b|FAILED\b|"
    r"[Ff]ailed\b|[Ff]ailure\b|Killed\b|[Aa]bort(?:ed|ing)?\b|[Ss]egmentation fault|core dumped|[Tt]erminated\b)"
    r"|^\d+(?:,[-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))*,[-+]?(?:nan|inf)(?:,|$)"  # a CSV row with a nan, its header cut
    r"|^\d+(?:\s+[-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))*\s+[-+]?(?:nan|inf)\s*$"  # the same, columns apart: "76980 nan"
)
# a value of no known name printed non-finite ("value = nan", a rich box's row "│  Value: inf  │", JSON's '"acc":
# NaN'), unless numpy's mean of nothing ("Mean Reward: nan")
NAN_VALUE = re.compile(
    r"\b[A-Za-z]\w* ?[=:] ?[-+]?(?:nan|inf)\s*[│┃]?\s*$|[\"'][A-Za-z]\w*[\"']: ?(?:NaN|-?Infinity)\b"
)
WARNED = re.compile(r"\bWARN(?:ING)?\b|\[W ")  # a logger's warning level before a line
# the same words where nothing went wrong: a warning, a retry, an overflow skip, an error rate or metric (RETURNN's
# "error 0.997", "Test Error: Accuracy: 97.1%"), a count of none, an option's name, a fallback to a default
NOT_SUSPECT = re.compile(
    r"[Ww]arn(?:ing)?s?\b|WARN|\[W |^W\d{4} |\bINFO\b|\bDEBUG\b|[Rr]etr(?:y|ying|ied)\b|[Ss]kipp(?:ing|ed)|"
    r"[Oo]verflow|[Ee]rror[_ ]?[Rr]ate|[Ww]ord [Ee]rror|\b[WCP]ER\b|\b(?:0|no|zero) (?:errors?|failures?|failed)\b|"
    r"(?:errors?|failures?|failed)\s*[=:]\s*0\b|error_file|ignore|--\w*(?:error|fail)|\w_(?:error|errors|failed)\b|"
    r"(?:error|fail)_\w|[Ee]rror [Ff]eedback|on_exception|if (?:it )?fail|"
    r"\[\w+ [WID] \d|\d: [WI] [\w/.]+:\d+\]|\bnot a failure\b|[Ee]rror(?:\s*[:=]\s*[-+\d.]|\s+(?:was\s+)?[-+]?\d*\.\d)|"
    r"(?:Test|Train|Val\w*|Eval\w*) [Ee]rror:\s*(?:$|Avg|Accuracy)|"
    r"[Ff]all(?:ing)?[ -]?back|[Uu]sing .{0,40}default|No graph saved|^Terminated at \w{3} \w{3} |"  # LSF's report
    r"^#(?:BSUB|SBATCH|PBS|\$) "  # a scheduler's directive in the job script its report echoes ("#BSUB -e %J.err")
)

# Windows' status for a hardware fault, its SIGSEGV, SIGFPE or SIGILL, as an unsigned and a signed exit code
_FAULTS = {0xC0000005: "an access violation", 0xC00000FD: "a stack overflow", 0xC0000094: "an integer division by zero",
           0xC000001D: "an illegal instruction"}  # fmt: skip
WINDOWS_SEGV = {c - k: f"{said} (0x{c:08X})" for c, said in _FAULTS.items() for k in (0, 1 << 32)}
# a data loader's worker that never gave its batch (MXNet Gluon's, PyTorch's "DataLoader timed out after N seconds")
LOADER_TIMEOUT = re.compile(r"(?:Worker|DataLoader) timed out after (\d+) seconds")
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 7: "SIGBUS", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2",
           15: "SIGTERM"}  # fmt: skip


# a row of numbers without its header ("   0/272     18/7328       nan       nan   116", "[ INFO : ... ] - |  3| nan|"),
# a stamp or a logger's bracket before it at most: no names, but nan among numbers is a value gone non-finite
_CELL = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?%?|\d+/\d+|\(?\d+[hms]\)?|nan|inf|-{2,}", re.I)
_ROW_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\d[ T][\d:,.]+|\[[^\]]{0,80}\]\s*-?)\s*")


def nonfinite_row(text: str) -> tuple[str, int | None] | None:
    """``(what, step)`` of a headerless row of numbers with a nan or inf (words may follow a leading counter): its step
    its last ``N/M`` (the batch), else a first whole number the next cell is not; None for any other line."""
    if "nan" not in text.lower() and "inf" not in text.lower():
        return None
    cells = [c for c in re.split(r"[\s|\[\]]+", _ROW_PREFIX.sub("", text, count=1)) if c]
    bad = next((i for i, c in enumerate(cells) if c.lower() in ("nan", "inf")), None)
    if bad is None or len(cells) < 4 or not all(_CELL.fullmatch(c) for c in cells[: bad + 1]):
        return None
    if not all(_CELL.fullmatch(c) for c in cells) and (bad < 2 or not cells[0].isdigit()):
        return None
    fractions = [c for c in cells if "/" in c and _CELL.fullmatch(c)]
    lone = cells[0].isdigit() and not cells[1].isdigit()
    step = int(fractions[-1].split("/")[0]) if fractions else int(cells[0]) if lone else None
    return "a row of numbers with nan among them", step


def shell_pid(text: str) -> int | None:
    """The pid bash names a child by ("run.sh: line 11: 16020 Killed  python train.py")."""
    m = re.search(r"line \d+:\s+(\d+) ", text)
    return int(m.group(1)) if m else None


def exit_signal(code: int | None, shell: bool = False) -> str | None:
    """The signal an exit code says: Python's -N, a shell's 128 + N (``shell``), Windows' access violation."""
    if code is not None and shell and 128 < code <= 128 + 64:
        code = 128 - code
    if code is not None and -64 <= code < 0:
        return SIGNALS.get(-code, f"signal {-code}")
    return WINDOWS_SEGV.get(code)


def signame(said: str) -> str:
    """``15`` / ``SIGTERM`` -> ``SIGTERM``."""
    return SIGNALS.get(int(said), f"signal {said}") if said.isdigit() else said
