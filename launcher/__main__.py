from ringreduce.launcher.cli import main

main()
