from gpuaas_cli.app import main

main()
