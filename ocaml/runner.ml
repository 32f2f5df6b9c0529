(* A long-lived runner: one request per line on stdin, "CMO NONCE TIMEOUT_MS". For each it forks a
   child that loads the compiled harness with Dynlink (no link step, no exec), and replies with the
   child's tally lines, each prefixed "R ", then one line "E <how it ended>". The runner runs under the
   parent's resource limits, which every child inherits.

   The test unit must never be readable by the completion it judges. Dynlink runs the unit while it
   loads it, so nothing can happen between the two; instead the unit's first item calls [Tally.seal],
   and before anything of the problem or of the completion runs, the child:
   - unlinks the unit, so nothing can open it again (the checker wrote it 0600, so that once dropped
     to the --uid below the child could not have read it either);
   - points every descriptor it does not need at /dev/null (Dynlink keeps the unit open while it runs
     it, and where /proc is mounted /proc/self/fd would reopen it);
   - with --uid N, drops to that unprivileged uid for good. So the runner itself stays root, and only
     this child, once sealed, runs as N.
   Unlinking, not permissions alone, is what also holds for a trainer that is not root: the child can
   unlink what its own user wrote, and no second uid is needed.

   With --sweep (given only where the runner is the init of a new PID namespace, bwrap --as-pid-1) no
   process a completion spawned outlives its job. Every process of the namespace is then the runner's
   descendant, and orphans become its children: when none is left after a job, nothing is swept (the
   common case costs no fork); otherwise it kills every process of the test uid, as uid N in a forked
   helper when given, else as itself, never as root. *)

let devnull = lazy (Unix.openfile "/dev/null" [ Unix.O_RDWR ] 0)

(* On Unix a descriptor is its number. The runner's open-file limit (ocaml_sandbox.py sets it and
   passes it as --open-files) bounds the numbers in use; Dynlink's is one of the lowest free ones. *)
let descriptor (n : int) : Unix.file_descr = Obj.magic n

let drop_to uid =
  Unix.setgroups [||];
  Unix.setgid uid;
  Unix.setuid uid;
  if Unix.getuid () <> uid || Unix.geteuid () <> uid || Unix.getgid () <> uid then failwith "uid drop failed"

let seal ~uid ~open_files cmo keep () =
  try
    Unix.unlink cmo;
    let null = Lazy.force devnull in
    for n = 3 to open_files - 1 do
      let fd = descriptor n in
      if fd <> keep && fd <> null then
        match Unix.fstat fd with
        | _ -> Unix.dup2 ~cloexec:true null fd
        | exception Unix.Unix_error _ -> ()
    done;
    Option.iter drop_to uid
  with exn ->
    (* Nothing of the problem or the completion has run yet, and nothing will, unsealed. *)
    let report = Unix.out_channel_of_descr keep in
    output_string report ("! sealing the test unit failed: " ^ Tally.describe exn ^ "\n");
    flush report;
    Unix._exit 4

let child ~uid ~open_files cmo nonce read_end write_end =
  ignore (Unix.setsid ());
  Unix.close read_end;
  let null = Lazy.force devnull in
  List.iter (fun fd -> Unix.dup2 ~cloexec:false null fd) [ Unix.stdin; Unix.stdout; Unix.stderr ];
  let channel = Unix.out_channel_of_descr write_end in
  Tally.pending := Some { Tally.nonce; channel };
  Tally.sealing := seal ~uid ~open_files cmo write_end;
  (try Dynlink.loadfile cmo
   with Dynlink.Error err ->
     (* It names the unit's path, which ocaml_sandbox.py scrubs from the logs. *)
     output_string channel ("! " ^ Tally.printable (Dynlink.error_message err) ^ "\n");
     flush channel;
     Unix._exit 3);
  exit 0

let now () = Unix.gettimeofday ()

(* Reads the child's tally until end of file or the deadline; true when the deadline passed. *)
let collect fd deadline buffer =
  let chunk = Bytes.create 4096 in
  let rec loop () =
    let left = deadline -. now () in
    if left <= 0. then true
    else
      match Unix.select [ fd ] [] [] left with
      | [], _, _ -> true
      | _ -> (
          match Unix.read fd chunk 0 4096 with
          | 0 -> false
          | n ->
              if Buffer.length buffer < 1_000_000 then Buffer.add_subbytes buffer chunk 0 n;
              loop ())
      | exception Unix.Unix_error (Unix.EINTR, _, _) -> loop ()
  in
  loop ()

let rec reap pid =
  match Unix.waitpid [] pid with
  | _, status -> status
  | exception Unix.Unix_error (Unix.EINTR, _, _) -> reap pid

(* Reaps what has ended; true when a process is still running. *)
let rec anyone_left () =
  match Unix.waitpid [ Unix.WNOHANG ] (-1) with
  | 0, _ -> true
  | _ -> anyone_left ()
  | exception Unix.Unix_error (Unix.EINTR, _, _) -> anyone_left ()
  | exception Unix.Unix_error _ -> false

let rec reap_all () =
  match Unix.waitpid [] (-1) with
  | _ -> reap_all ()
  | exception Unix.Unix_error (Unix.EINTR, _, _) -> reap_all ()
  | exception Unix.Unix_error _ -> ()

(* kill (-1) reaches every process the caller may signal: as uid N that is exactly the processes of
   uid N; the runner never sends it as root. Everything killed was a descendant: reap it all. *)
let sweep ~uid =
  if anyone_left () then begin
    let kill_all () = try Unix.kill (-1) Sys.sigkill with Unix.Unix_error _ -> () in
    (match uid with
    | Some uid -> (
        match Unix.fork () with
        | 0 ->
            (try
               drop_to uid;
               kill_all ()
             with _ -> ());
            Unix._exit 0
        | pid -> ignore (reap pid))
    | None -> if Unix.getuid () <> 0 then kill_all ());
    reap_all ()
  end

let run ~uid ~open_files ~sweep_after cmo nonce timeout_ms =
  let read_end, write_end = Unix.pipe ~cloexec:true () in
  flush stdout;
  match Unix.fork () with
  | 0 -> child ~uid ~open_files cmo nonce read_end write_end
  | pid ->
      Unix.close write_end;
      let buffer = Buffer.create 256 in
      let timed_out = collect read_end (now () +. (float_of_int timeout_ms /. 1000.)) buffer in
      Unix.close read_end;
      if timed_out then (try Unix.kill (-pid) Sys.sigkill with Unix.Unix_error _ -> ());
      (try Unix.kill pid Sys.sigkill with Unix.Unix_error _ -> ());
      let status = reap pid in
      if sweep_after then sweep ~uid;
      let ending =
        if timed_out then "timeout"
        else
          match status with
          | Unix.WEXITED code -> Printf.sprintf "exit %d" code
          | Unix.WSIGNALED signal | Unix.WSTOPPED signal -> Printf.sprintf "signal %d" signal
      in
      String.split_on_char '\n' (Buffer.contents buffer)
      |> List.iter (fun line -> if line <> "" then print_string ("R " ^ line ^ "\n"));
      print_string ("E " ^ ending ^ "\n");
      flush stdout

(* Arguments: --open-files N (the open-file limit it runs under) [--uid N] [--sweep]. *)
let () =
  let rec options open_files uid sweep = function
    | "--open-files" :: n :: rest -> options (Some (int_of_string n)) uid sweep rest
    | "--uid" :: n :: rest -> options open_files (Some (int_of_string n)) sweep rest
    | "--sweep" :: rest -> options open_files uid true rest
    | _ -> (open_files, uid, sweep)
  in
  let open_files, uid, sweep_after = options None None false (List.tl (Array.to_list Sys.argv)) in
  (* Without it the child would not know which descriptors to close before the completion runs. *)
  let open_files = match open_files with Some n -> n | None -> failwith "runner: --open-files N missing" in
  Sys.set_signal Sys.sigpipe Sys.Signal_ignore;
  (* Initialises Dynlink here, once, rather than in every child. Completions cannot name Unix or
     Dynlink although they are linked in: the checker's load path holds only the stdlib and Tally. *)
  ignore (Dynlink.all_units ());
  (* A small heap makes every fork cheaper. *)
  Gc.compact ();
  try
    while true do
      match String.split_on_char ' ' (input_line stdin) with
      | [ cmo; nonce; timeout_ms ] -> run ~uid ~open_files ~sweep_after cmo nonce (int_of_string timeout_ms)
      | _ ->
          print_string "E bad-request\n";
          flush stdout
    done
  with End_of_file -> ()
